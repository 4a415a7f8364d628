"""The dispatcher's HTTP side: the internal direct-path endpoint, health and metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response

from dispatcher.service import DispatcherService
from msgbus.auth import bearer_token, same_secret
from msgbus.brokers.direct import INTERNAL_PATH
from msgbus.codec import decode_batch
from msgbus.errors import Unauthorized, Unavailable
from msgbus.http import install_error_handlers, metrics_response


def create_app(service: DispatcherService) -> FastAPI:
    token = service.settings.connections.internal_token.get_secret_value()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title="msgbus dispatcher", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)

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

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return metrics_response()

    return app
