"""The dispatcher's HTTP side: the internal direct-path endpoint, health and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from dispatcher.service import DispatcherService
from msgbus.auth import bearer_token, same_secret
from msgbus.brokers.direct import INTERNAL_PATH
from msgbus.codec import decode_batch
from msgbus.errors import Unauthorized, Unavailable
from msgbus.http import add_readiness, service_app


def create_app(service: DispatcherService) -> FastAPI:
    token = service.settings.connections.internal_token.get_secret_value()

    app = service_app("msgbus dispatcher", service)

    @app.post(INTERNAL_PATH, status_code=202, include_in_schema=False)
    async def direct(request: Request) -> dict[str, int]:
        if not same_secret(bearer_token(request.headers.get("authorization")), token):
            raise Unauthorized("internal endpoint: bad token")
        envelopes = decode_batch(await request.body())
        accepted_all = True
        for envelope in envelopes:
            accepted_all = service.supervisor.offer_direct(envelope) and accepted_all
        if not accepted_all:
            raise Unavailable("a subscription's direct queue is full")
        return {"accepted": len(envelopes)}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "instance": service.instance,
                "mongo": await service.store.ping(),
                "subscriptions": service.supervisor.subscription_ids(),
                "trace_backlog": service.trace.backlog()}

    async def readiness() -> dict[str, bool]:
        buffer = service.trace_buffer  # outcomes wait here while MongoDB is down
        return {"trace_buffer_has_room": buffer.used_bytes < buffer.max_bytes,
                "mongo": await service.store.ping()}

    add_readiness(app, readiness, required=("trace_buffer_has_room",), service="dispatcher")
    return app
