"""The management API. Every route but /health needs `Authorization: Bearer <admin token>`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse

from admin.operations import add_operation_routes
from admin.schemas import AppIn, DestinationIn, RuntimeIn, SubscriptionIn
from admin.service import AdminService
from msgbus.auth import bearer_token, same_secret
from msgbus.errors import NotFound, Unauthorized
from msgbus.http import service_app
from msgbus.models import Destination, Subscription, new_signing_secret, utcnow


def create_app(service: AdminService) -> FastAPI:
    token = service.settings.token.get_secret_value()

    def require_admin(request: Request) -> None:
        if not same_secret(bearer_token(request.headers.get("authorization")), token):
            raise Unauthorized("missing or wrong admin token")

    app = service_app("msgbus admin", service)
    store = service.store
    admin = [Depends(require_admin)]

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def home() -> str:
        mongo = "up" if await store.ping() else "DOWN"
        destinations = await store.list_destinations() if mongo == "up" else []
        rows = "".join(f"<li>{d.code} ({d.broker.value})</li>" for d in destinations)
        return (f"<!doctype html><title>msgbus</title><h1>msgbus</h1><p>MongoDB: {mongo}</p>"
                f"<h2>Destinations</h2><ul>{rows or '<li>none yet</li>'}</ul>")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "mongo": await store.ping()}

    @app.get("/v1/destinations", dependencies=admin)
    async def list_destinations() -> list[dict[str, Any]]:
        return [d.model_dump(mode="json") for d in await store.list_destinations()]

    @app.put("/v1/destinations/{code}", dependencies=admin)
    async def put_destination(code: str, body: DestinationIn) -> dict[str, Any]:
        fields = body.model_dump()
        try:  # a broker switch is remembered: dispatchers drain the previous broker
            existing = await store.get_destination(code)
            destination = existing.with_broker(body.broker, utcnow()).model_copy(
                update={k: v for k, v in fields.items() if k != "broker"})
        except NotFound:
            destination = Destination(code=code, **fields)
        await store.save_destination(destination)
        return destination.model_dump(mode="json")

    @app.get("/v1/runtime", dependencies=admin)
    async def get_runtime() -> dict[str, Any]:
        return await service.runtime_view()

    @app.patch("/v1/runtime", dependencies=admin)
    async def patch_runtime(body: RuntimeIn) -> dict[str, Any]:
        await service.update_runtime(body)
        return await service.runtime_view()

    @app.get("/v1/subscriptions", dependencies=admin)
    async def list_subscriptions(destination: str | None = None) -> list[dict[str, Any]]:
        subs = await store.list_subscriptions(destination)
        return [s.model_dump(mode="json", exclude={"signing_secrets"}) for s in subs]

    @app.put("/v1/destinations/{code}/subscriptions/{name}", dependencies=admin)
    async def put_subscription(code: str, name: str, body: SubscriptionIn) -> dict[str, Any]:
        await store.get_destination(code)
        try:
            existing = await store.get_subscription(f"{code}/{name}")
            sub = existing.model_copy(update={**dict(body), "updated_at": utcnow()})
        except NotFound:
            sub = Subscription(destination=code, name=name, **body.model_dump())
        await store.save_subscription(sub)
        # The signing secrets are shown to whoever configures the subscriber.
        return sub.model_dump(mode="json")

    async def change_subscription(code: str, name: str,
                                  change: Callable[[Subscription], dict[str, Any]]
                                  ) -> Subscription:
        """Reads the subscription, applies the fields `change` returns for it, saves it."""
        sub = await store.get_subscription(f"{code}/{name}")
        sub = sub.model_copy(update={**change(sub), "updated_at": utcnow()})
        await store.save_subscription(sub)
        return sub

    @app.post("/v1/destinations/{code}/subscriptions/{name}/pause", dependencies=admin)
    async def pause_subscription(code: str, name: str) -> dict[str, Any]:
        """Dispatchers stop pushing within seconds; messages wait in the broker."""
        sub = await change_subscription(code, name, lambda _: {"paused": True})
        return sub.model_dump(mode="json", exclude={"signing_secrets"})

    @app.post("/v1/destinations/{code}/subscriptions/{name}/resume", dependencies=admin)
    async def resume_subscription(code: str, name: str) -> dict[str, Any]:
        sub = await change_subscription(code, name, lambda _: {"paused": False})
        return sub.model_dump(mode="json", exclude={"signing_secrets"})

    @app.post("/v1/destinations/{code}/subscriptions/{name}/secrets/rotate",
              dependencies=admin)
    async def rotate_secret(code: str, name: str) -> dict[str, Any]:
        """A new signing secret; pushes are signed with it and the previous one until
        `.../secrets/previous` is deleted, so the subscriber can switch without a gap."""
        sub = await change_subscription(code, name, lambda old: {
            "signing_secrets": [new_signing_secret(), old.signing_secrets[0]]})
        return {"signing_secrets": sub.signing_secrets}

    @app.delete("/v1/destinations/{code}/subscriptions/{name}/secrets/previous",
                dependencies=admin)
    async def drop_previous_secret(code: str, name: str) -> dict[str, Any]:
        sub = await change_subscription(code, name, lambda old: {
            "signing_secrets": old.signing_secrets[:1]})
        return {"signing_secrets": sub.signing_secrets}

    @app.post("/v1/apps", status_code=201, dependencies=admin)
    async def create_app_key(body: AppIn) -> dict[str, Any]:
        key = await service.create_producer_app(body.name, body.destinations)
        return {"name": body.name, "destinations": body.destinations, "api_key": key,
                "note": "the key is shown only once; msgbus stores only its hash"}

    @app.get("/v1/messages", dependencies=admin)
    async def find_messages(biz_id: str | None = None, destination: str | None = None,
                            since: datetime | None = None, until: datetime | None = None,
                            limit: int = 100) -> list[dict[str, Any]]:
        found = await store.find_messages(biz_id=biz_id, destination=destination, since=since,
                                          until=until, limit=min(limit, 1000))
        return [service.message_summary(doc) for doc in found]

    @app.get("/v1/messages/{message_id}", dependencies=admin)
    async def message_detail(message_id: str) -> dict[str, Any]:
        return await service.message_timeline(message_id)

    add_operation_routes(app, store, admin)
    return app
