"""The receiver's HTTP API (FastAPI). Bodies are read raw and parsed with orjson: faster than a
pydantic request model, and every error names the field at fault. The OpenAPI document of the
two ingest endpoints is written by hand in receiver/openapi.py for the same reason.

The two ingest endpoints are lean ASGI apps (msgbus.http.LeanEndpoint) on plain Starlette
routes, which RequestTimer calls directly for a POST: FastAPI's per-request machinery
(dependency solving, Request/Headers objects, exception middleware, router) cost about a quarter
of a single message's CPU time. They answer errors exactly as the FastAPI handlers would."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from pymongo.errors import PyMongoError
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from msgbus import telemetry
from msgbus.errors import (
    BufferFull,
    InvalidInput,
    InvalidMessage,
    MessageTooLarge,
    MsgbusError,
    NotFound,
    Unavailable,
    UnsupportedMediaType,
)
from msgbus.http import (
    Asgi,
    LeanEndpoint,
    RequestTimer,
    add_readiness,
    include_routes,
    service_app,
)
from msgbus.metrics import BUFFER_BYTES, MESSAGES_REJECTED, REQUEST_LATENCY
from msgbus.models import JSON_CONTENT_TYPE, Destination, Envelope, is_destination_code, utcnow
from msgbus.settings import ReceiverSettings
from msgbus.tracecontext import TraceContext, from_request
from receiver.intake import Intake
from receiver.openapi import BATCH_PATH, SINGLE_PATH, receiver_openapi
from receiver.parsing import (
    ID_HEADER,
    ExactJson,
    load_json,
    parse_envelope,
    parse_raw,
    raw_form_header,
)
from receiver.schema_route import router as schema_router
from receiver.service import ReceiverService
from receiver.validation import NOT_PARSED, BodyValidator

log = logging.getLogger(__name__)

_SINGLE_PREFIX, _SINGLE_SUFFIX = "/v1/destinations/", "/messages"
_AUTHORIZATION, _CONTENT_TYPE = b"authorization", b"content-type"
_CONTENT_LENGTH = b"content-length"
_RAW_ID = ID_HEADER.encode()
_TRACEPARENT, _TRACESTATE = b"traceparent", b"tracestate"
_WANTED_HEADERS = frozenset({_AUTHORIZATION, _CONTENT_TYPE, _CONTENT_LENGTH, _RAW_ID,
                             _TRACEPARENT, _TRACESTATE})
LeanRoute = Callable[[dict[str, Any], str], Asgi | None]


def endpoint_of(path: str) -> str | None:
    """The route template of an ingest request's path (a label of bounded cardinality)."""
    if path == BATCH_PATH:
        return BATCH_PATH
    if path.startswith(_SINGLE_PREFIX) and path.endswith(_SINGLE_SUFFIX) and (
            path.count("/") == 4):
        return SINGLE_PATH
    return None


def _code_of(scope: dict[str, Any]) -> str:
    """The {code} of a single-message path: "" when empty (no route matches it then)."""
    params = scope.get("path_params")
    if params:  # reached through the router
        return str(params["code"])
    return str(scope["path"])[len(_SINGLE_PREFIX):-len(_SINGLE_SUFFIX)]


def _client_of(scope: dict[str, Any]) -> str:
    """The caller's address (behind a proxy named in FORWARDED_ALLOW_IPS, the one it
    forwards: uvicorn puts it in the scope)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def _headers_of(scope: dict[str, Any]) -> dict[bytes, str]:
    """The few request headers the handlers read, first occurrence of each (as Starlette's
    Headers.get; ASGI servers give lower-case names)."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _WANTED_HEADERS and name not in found:
            found[name] = value.decode("latin-1")
    return found


def _request_trace(headers: dict[bytes, str]) -> TraceContext:
    return from_request(headers.get(_TRACEPARENT), headers.get(_TRACESTATE))


def _json(data: Any, status_code: int) -> tuple[int, bytes]:
    return status_code, orjson.dumps(data)


def _is_json(content_type: str | None) -> bool:
    """A JSON envelope comes as application/json, or with no Content-Type at all."""
    return not content_type or (
        content_type.partition(";")[0].strip().lower() == JSON_CONTENT_TYPE)


def _require_json(content_type: str | None, *, raw_allowed: bool) -> None:
    if content_type is not None and not _is_json(content_type):
        raw = (f", or the message itself with its own Content-Type and a {ID_HEADER} header"
               if raw_allowed else "")
        raise UnsupportedMediaType(f"Content-Type {content_type[:100]!r}: send a JSON "
                                   f"envelope as application/json{raw}", field="content-type")


async def _read_limited(receive: Any, headers: dict[bytes, str], limit: int) -> bytes:
    """The body, refused as soon as it is over `limit` bytes (never read whole first)."""
    declared = headers.get(_CONTENT_LENGTH)
    if declared is not None and declared.isascii() and declared.isdigit() and (
            int(declared) > limit):
        raise MessageTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "http.request":
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limit:
                        raise MessageTooLarge(f"request body is over the limit of {limit} bytes")
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            elif kind == "http.disconnect":
                raise ClientDisconnect()
    except ClientDisconnect as exc:
        raise InvalidInput("the client went away before sending the whole body") from exc
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _echo_id(item: Any) -> str | None:
    """A batch item's message_id for its result (never an arbitrary JSON value)."""
    value = item.get("message_id") if isinstance(item, dict) else None
    return value if isinstance(value, str) and len(value) <= 100 else None


def _batch_item(batch: ExactJson, index: int) -> Any:
    return batch()["messages"][index]


class Ingest:
    """What both endpoints share: the destination check and the durable accept."""

    def __init__(self, service: ReceiverService) -> None:
        self._registry = service.registry
        self._intake: Intake = service.intake
        self.validator = BodyValidator(service.registry)

    async def check_destination(self, code: str) -> Destination:
        if not is_destination_code(code):
            raise NotFound(f"unknown destination {code[:100]!r} (a code is 1-100 characters "
                           "of a-z, 0-9, '_', '.' and '-')", field="destination")
        try:
            return await self._registry.destination(code)
        except PyMongoError as exc:
            raise Unavailable(f"cannot look up destination {code!r} while MongoDB is "
                              "unavailable; retry later") from exc

    async def accept(self, envelopes: list[Envelope]) -> list[bool]:
        try:
            return await self._intake.accept(envelopes)
        except MsgbusError as exc:
            for envelope in envelopes:
                MESSAGES_REJECTED.labels(envelope.destination, exc.code).inc()
            if isinstance(exc, BufferFull):
                raise BufferFull("the receiver's buffer is full (it takes messages faster than "
                                 "it can record them); retry later") from exc
            if isinstance(exc, Unavailable):
                log.warning("the local buffer refused %d messages: %s", len(envelopes), exc)
                raise Unavailable("the receiver cannot write its buffer; retry later") from exc
            raise


class IngestEndpoints:
    """The two ingest endpoints' handlers (each a LeanEndpoint's `handle`), with what they read
    of the service bound once; `install` adds their routes and the RequestTimer that calls
    them directly."""

    __slots__ = ("_auth", "_ingest", "_settings", "_single_limit")

    def __init__(self, service: ReceiverService) -> None:
        self._settings = service.settings
        self._auth = service.auth
        self._ingest = Ingest(service)
        # JSON overhead around a body of max_message_bytes
        self._single_limit = service.settings.max_message_bytes * 2 + 16 * 1024

    def install(self, app: FastAPI) -> None:
        lean_one, lean_batch = LeanEndpoint(self.send_one), LeanEndpoint(self.send_batch)
        # plain Starlette routes, where the FastAPI routes were (same 404/405 for other requests)
        app.router.routes.append(Route(SINGLE_PATH, lean_one, methods=["POST"], name="send_one"))
        app.router.routes.append(Route(BATCH_PATH, lean_batch, methods=["POST"],
                                       name="send_batch"))
        app.add_middleware(RequestTimer, histogram=REQUEST_LATENCY, endpoint_of=endpoint_of,
                           lean_route=_lean_route(lean_one, lean_batch))

    async def send_one(self, scope: dict[str, Any], receive: Any) -> tuple[int, bytes]:
        settings, auth, ingest = self._settings, self._auth, self._ingest
        single_limit = self._single_limit
        code = _code_of(scope)
        headers = _headers_of(scope)
        destination = ""  # the metric label: only a known destination, never any URL text
        try:
            producer = await auth.authenticate(headers.get(_AUTHORIZATION), _client_of(scope))
            found = await ingest.check_destination(code)
            destination = code
            producer.check_allowed(found)
            now = utcnow()
            content_type = headers.get(_CONTENT_TYPE)
            if _RAW_ID in headers and not _is_json(content_type):
                raw = await _read_limited(receive, headers, settings.max_message_bytes)
                envelope = parse_raw(raw, scope["headers"], destination=code,
                                     source_app=producer.name,
                                     max_body_bytes=settings.max_message_bytes, now=now,
                                     request_trace=_request_trace(headers))
                ingest.validator.check(envelope)
            else:
                _require_json(content_type, raw_allowed=True)
                misplaced = raw_form_header(scope["headers"])
                if misplaced is not None:
                    raise InvalidMessage(
                        f"the {misplaced} header goes with a raw message of another "
                        "Content-Type; a JSON envelope carries message_id, biz_id, created_at "
                        "and headers itself (JSON bytes to keep as they are: body_base64)",
                        field=misplaced)
                raw = await _read_limited(receive, headers, single_limit)
                data = load_json(raw)
                envelope = parse_envelope(data, destination=code,
                                          source_app=producer.name,
                                          max_body_bytes=settings.max_message_bytes, now=now,
                                          exact=ExactJson(raw),
                                          request_trace=_request_trace(headers))
                ingest.validator.check(envelope, data.get("body", NOT_PARSED))
        except MsgbusError as exc:
            MESSAGES_REJECTED.labels(destination, exc.code).inc()
            raise
        with telemetry.batch_span("msgbus accept", [envelope]):
            [fresh] = await ingest.accept([envelope])
        return _json({"message_id": envelope.message_id,
                      "status": "accepted" if fresh else "duplicate"}, 202)

    async def send_batch(self, scope: dict[str, Any], receive: Any) -> tuple[int, bytes]:
        settings, auth, ingest = self._settings, self._auth, self._ingest
        headers = _headers_of(scope)
        try:
            producer = await auth.authenticate(headers.get(_AUTHORIZATION), _client_of(scope))
            _require_json(headers.get(_CONTENT_TYPE), raw_allowed=False)
            raw = await _read_limited(receive, headers, settings.max_batch_bytes)
            data = load_json(raw)
            messages = data.get("messages") if isinstance(data, dict) else None
            if not isinstance(messages, list) or not messages:
                raise InvalidInput("a batch is an object with a non-empty 'messages' array",
                                   field="messages")
            if len(messages) > settings.max_batch_count:
                raise MessageTooLarge(f"a batch holds at most {settings.max_batch_count} "
                                      f"messages; got {len(messages)}", field="messages")
        except MsgbusError as exc:
            MESSAGES_REJECTED.labels("", exc.code).inc()
            raise
        now = utcnow()
        exact_batch = ExactJson(raw)
        request_trace = _request_trace(headers)
        results: list[dict[str, Any]] = []
        accepted: list[tuple[int, Envelope]] = []
        for index, item in enumerate(messages):
            destination = ""
            try:
                code = item.get("destination") if isinstance(item, dict) else None
                if not isinstance(code, str):
                    raise InvalidMessage("each message of a batch needs a 'destination' string",
                                         field="destination")
                found = await ingest.check_destination(code)
                destination = code
                producer.check_allowed(found)
                envelope = parse_envelope(item, destination=code, source_app=producer.name,
                                          max_body_bytes=settings.max_message_bytes, now=now,
                                          exact=partial(_batch_item, exact_batch, index),
                                          request_trace=request_trace)
                ingest.validator.check(envelope, item.get("body", NOT_PARSED))
            except MsgbusError as exc:
                MESSAGES_REJECTED.labels(destination, exc.code).inc()
                results.append({"message_id": _echo_id(item), "status": exc.status_code,
                                "error": exc.to_json()})
                continue
            accepted.append((len(results), envelope))
            results.append({"message_id": envelope.message_id, "status": 202, "error": None})
        if accepted:
            envelopes = [envelope for _, envelope in accepted]
            with telemetry.batch_span("msgbus accept", envelopes):
                fresh = await ingest.accept(envelopes)
            for (index, _), is_new in zip(accepted, fresh, strict=True):
                if not is_new:
                    results[index]["duplicate"] = True
        return _json({"results": results}, 200)


def _lean_route(lean_one: Asgi, lean_batch: Asgi) -> LeanRoute:
    def lean_route(scope: dict[str, Any], endpoint: str) -> Asgi | None:
        """A POST to an ingest route goes straight to its handler (what the router would pick:
        endpoint_of's single-message paths but one, with an empty code, match the route)."""
        if scope["method"] != "POST":
            return None
        if endpoint == BATCH_PATH:
            return lean_batch
        return lean_one if _code_of(scope) else None

    return lean_route


def _refresh_gauges(service: ReceiverService) -> None:
    service.intake.depths()
    BUFFER_BYTES.labels("receiver", "used").set(service.buffer.used_bytes)
    BUFFER_BYTES.labels("receiver", "limit").set(service.buffer.max_bytes)


def _openapi(app: FastAPI, settings: ReceiverSettings) -> dict[str, Any]:
    """The app's OpenAPI document (FastAPI's documented override of app.openapi)."""
    if app.openapi_schema is None:
        app.openapi_schema = receiver_openapi(app, settings)
    return app.openapi_schema


async def _service(request: Request) -> ReceiverService:
    service: ReceiverService = request.app.state.service
    return service


probes = APIRouter()


def flusher_state(service: ReceiverService) -> dict[str, Any]:
    process = service.flush_process
    if process is None:
        return {"mode": "inline"}
    return {"mode": "process", "pid": process.pid, "restarts": process.restarts,
            "mongo_gate": process.mongo_gate()}


@probes.get("/health")
async def health(service: Annotated[ReceiverService, Depends(_service)]) -> dict[str, Any]:
    return {"status": "ok", "mongo": await service.store.ping(),
            "mongo_gate": service.store.gate.state(),
            "buffer": service.intake.depths(), "flusher": flusher_state(service)}


async def _readiness(service: ReceiverService) -> dict[str, bool]:
    buffer = service.buffer
    checks = {"buffer_has_room": buffer.used_bytes < buffer.max_bytes,
              "mongo": await service.store.ping()}  # not required: the buffer absorbs it
    if service.flush_process is not None:
        checks["flusher_running"] = service.flush_process.pid is not None
    return checks


def create_app(service: ReceiverService) -> FastAPI:
    # Rejections are counted by the handlers, which know the destination (no on_error hook).
    app = service_app("msgbus receiver", service,
                      before_metrics=partial(_refresh_gauges, service))
    app.state.service = service
    IngestEndpoints(service).install(app)
    include_routes(app, probes)
    include_routes(app, schema_router)
    add_readiness(app, partial(_readiness, service), required=("buffer_has_room",),
                  service="receiver")
    app.openapi = partial(_openapi, app, service.settings)  # type: ignore[method-assign]
    return app
