"""`GET /v1/destinations/{code}/schema`: the latest payload schema of a destination, for
producers that validate before they send (the client's `validate=True`). Authenticated by the
producer's API key, for the destinations it may send to; served from the registry."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request

from msgbus.errors import NotFound
from msgbus.models import CODE_PATTERN
from receiver.service import ReceiverService

router = APIRouter()


@router.get("/v1/destinations/{code}/schema")
async def latest_schema(
    request: Request,
    code: Annotated[str, Path(pattern=CODE_PATTERN, description="a destination's code")],
    authorization: Annotated[str | None, Header(
        description="Bearer <the producer app's API key>")] = None,
) -> dict[str, Any]:
    """The version of the destination's payload schema the receiver validates against now
    (404 when the destination has none)."""
    service: ReceiverService = request.app.state.service
    producer = await service.auth.authenticate(
        authorization, request.client.host if request.client is not None else "")
    producer.check_allowed(await service.registry.destination(code))
    schema = service.registry.payload_schema(code)
    if schema is None:
        raise NotFound(f"destination {code!r} has no payload schema", field="code")
    return {"destination": code, "version": schema.version, "schema": schema.schema_,
            "compatibility": schema.compatibility.value}
