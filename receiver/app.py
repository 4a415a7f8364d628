"""The receiver's HTTP API (FastAPI). Bodies are read raw and parsed with orjson: faster than a
pydantic request model, and every error names the field at fault."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from msgbus.errors import InvalidInput, MessageTooLarge, MsgbusError
from msgbus.http import service_app
from msgbus.metrics import MESSAGES_REJECTED
from msgbus.models import utcnow
from receiver.parsing import load_json, parse_envelope
from receiver.service import ReceiverService

_MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["message_id"],
    "properties": {
        "message_id": {"type": "string", "format": "uuid", "description": "UUIDv7 from the client"},
        "biz_id": {"type": "string", "maxLength": 256},
        "created_at": {"type": "string", "format": "date-time"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "body": {"description": "any JSON value"},
        "body_base64": {"type": "string", "description": "opaque bytes instead of body"},
        "content_type": {"type": "string", "description": "MIME type of body_base64"},
    },
}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise MessageTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    raw = await request.body()
    if len(raw) > limit:
        raise MessageTooLarge(f"request body is {len(raw)} bytes; the limit is {limit}")
    return raw


def create_app(service: ReceiverService) -> FastAPI:
    settings = service.settings
    app = service_app("msgbus receiver", service,
                      on_error=lambda e: MESSAGES_REJECTED.labels(e.code).inc(),
                      before_metrics=service.pipeline.depths)
    # JSON overhead around a body of max_message_bytes
    single_limit = settings.max_message_bytes * 2 + 16 * 1024

    @app.post("/v1/destinations/{code}/messages", status_code=202,
              openapi_extra=_json_body(_MESSAGE_SCHEMA))
    async def send_one(code: str, request: Request) -> dict[str, str]:
        producer = await service.auth.authenticate(request.headers.get("authorization"))
        producer.check_allowed(code)
        await service.registry.destination(code)
        data = load_json(await _read_limited(request, single_limit))
        envelope = parse_envelope(data, destination=code, source_app=producer.name,
                                  max_body_bytes=settings.max_message_bytes, now=utcnow())
        [fresh] = await service.pipeline.accept([envelope])
        return {"message_id": envelope.message_id,
                "status": "accepted" if fresh else "duplicate"}

    batch_schema = {"type": "object", "required": ["messages"], "properties": {
        "messages": {"type": "array", "maxItems": settings.max_batch_count, "items": {
            "allOf": [_MESSAGE_SCHEMA, {"required": ["destination"]}]}}}}

    @app.post("/v1/messages", openapi_extra=_json_body(batch_schema))
    async def send_batch(request: Request) -> dict[str, Any]:
        producer = await service.auth.authenticate(request.headers.get("authorization"))
        data = load_json(await _read_limited(request, settings.max_batch_bytes))
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list) or not messages:
            raise InvalidInput("a batch is an object with a non-empty 'messages' array",
                               field="messages")
        if len(messages) > settings.max_batch_count:
            raise MessageTooLarge(f"a batch holds at most {settings.max_batch_count} messages; "
                                  f"got {len(messages)}", field="messages")
        now = utcnow()
        results: list[dict[str, Any]] = []
        accepted = []
        for item in messages:
            message_id = item.get("message_id") if isinstance(item, dict) else None
            try:
                code = item.get("destination") if isinstance(item, dict) else None
                if not isinstance(code, str):
                    raise InvalidInput("each message of a batch needs a 'destination'",
                                       field="destination")
                producer.check_allowed(code)
                await service.registry.destination(code)
                envelope = parse_envelope(item, destination=code, source_app=producer.name,
                                          max_body_bytes=settings.max_message_bytes, now=now)
            except MsgbusError as exc:
                MESSAGES_REJECTED.labels(exc.code).inc()
                results.append({"message_id": message_id, "status": exc.status_code,
                                "error": exc.to_json()})
                continue
            accepted.append((len(results), envelope))
            results.append({"message_id": envelope.message_id, "status": 202, "error": None})
        if accepted:
            fresh = await service.pipeline.accept([envelope for _, envelope in accepted])
            for (index, _), is_new in zip(accepted, fresh, strict=True):
                if not is_new:
                    results[index]["duplicate"] = True
        return {"results": results}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "mongo": await service.store.ping(),
                "buffer": service.pipeline.depths()}

    return app
