"""The compensator's HTTP side: health and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from compensator.service import CompensatorService
from msgbus.http import add_readiness, service_app


def create_app(service: CompensatorService) -> FastAPI:
    app = service_app("msgbus compensator", service)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "mongo": await service.store.ping(),
                "mongo_gate": service.store.gate.state(),
                "instance": service.instance, "subscriptions": service.subscription_ids,
                "retrying": service.rounds.draining,
                "swept": service.sweeper.swept, "last_sweep_s": service.sweeper.last_sweep_s}

    async def readiness() -> dict[str, bool]:
        return {"mongo": await service.store.ping()}  # retries and leases live there

    add_readiness(app, readiness, required=("mongo",), service="compensator")
    return app
