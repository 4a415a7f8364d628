"""The dispatcher's HTTP side: the internal direct-path endpoint, health and metrics."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dispatcher.service import DispatcherService
from msgbus.apidoc import OWN_ERRORS
from msgbus.auth import same_secret
from msgbus.brokers.direct import BATCH_CONTENT_TYPE, INTERNAL_PATH
from msgbus.codec import decode_batch
from msgbus.errors import InvalidMessage, Unauthorized, Unavailable
from msgbus.http import add_readiness, service_app
from msgbus.models import Envelope

INTERNAL_AUTH = HTTPBearer(scheme_name="internalToken", auto_error=False,
                           description="the bus's internal token (MSGBUS_INTERNAL_TOKEN)")


def _error_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/responses/{name}"}


DIRECT_OPERATION: dict[str, Any] = {
    "summary": "Hand messages to this dispatcher's subscriptions (the direct path)",
    "description": "For receivers only: a batch of envelopes as msgbus.codec.encode_batch "
                   "writes it. 202: every subscription of each message's destination queued it.",
    "requestBody": {"required": True, "content": {  # the receivers send the first; any goes
        media_type: {"schema": {"type": "string", "format": "binary"}}
        for media_type in (BATCH_CONTENT_TYPE, "application/octet-stream")}},
    "responses": {"401": _error_ref("Unauthorized"), "422": _error_ref("Invalid"),
                  "503": _error_ref("Unavailable")},
    OWN_ERRORS: True,
}


def decode_envelopes(body: bytes) -> list[Envelope]:
    if not body:
        raise InvalidMessage("an empty batch", field="body")
    try:
        return decode_batch(body)
    # the bytes come from the network: whatever they are, they are refused, never a 500
    except (ValueError, KeyError, TypeError, OverflowError, OSError) as exc:
        raise InvalidMessage(f"not a batch of msgbus envelopes ({type(exc).__name__})",
                             field="body") from exc


def create_app(service: DispatcherService) -> FastAPI:
    token = service.settings.connections.internal_token.get_secret_value()

    app = service_app("msgbus dispatcher", service)

    @app.post(INTERNAL_PATH, status_code=202, openapi_extra=DIRECT_OPERATION)
    async def direct(
            request: Request,
            credentials: Annotated[HTTPAuthorizationCredentials | None, Security(INTERNAL_AUTH)],
    ) -> dict[str, int]:
        given = None if credentials is None else credentials.credentials
        if not same_secret(given, token):
            raise Unauthorized("internal endpoint: bad token")
        envelopes = decode_envelopes(await request.body())
        accepted_all = True
        for envelope in envelopes:
            accepted_all = service.supervisor.offer_direct(envelope) and accepted_all
        if not accepted_all:
            raise Unavailable("a subscription's direct queue is full")
        return {"accepted": len(envelopes)}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "instance": service.instance,
                "mongo": await service.store.ping(), "mongo_gate": service.store.gate.state(),
                "subscriptions": service.supervisor.subscription_ids(),
                "trace_backlog": service.trace.backlog()}

    async def readiness() -> dict[str, bool]:
        buffer = service.trace_buffer  # outcomes wait here while MongoDB is down
        return {"trace_buffer_has_room": buffer.used_bytes < buffer.max_bytes,
                "mongo": await service.store.ping()}

    add_readiness(app, readiness, required=("trace_buffer_has_room",), service="dispatcher")
    return app
