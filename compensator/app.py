"""The compensator's HTTP side: health and metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response

from compensator.service import CompensatorService
from msgbus.http import install_error_handlers, metrics_response


def create_app(service: CompensatorService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title="msgbus compensator", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "mongo": await service.store.ping(),
                "retries_due": service.last_due}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return metrics_response()

    return app
