"""The payload schemas of destinations: register a version (checked against the latest one by
the destination's compatibility mode, admin/schema_compat.py), list and read versions, and try a
body against one. docs/schemas.md describes the rules and the answers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request

from admin.access import Catalogue, ChangesDestination
from admin.deps import Store, Users, parts_of
from admin.params import DestinationCode
from admin.removal import refuse_while_deleting
from admin.schema_compat import Change, incompatibilities
from admin.schemas import SchemaIn
from msgbus.errors import Conflict
from msgbus.models import PayloadSchema, SchemaCompatibility
from msgbus.payload_schema import compile_schema, first_error
from msgbus.store.deletions import DeletionStore
from msgbus.store.schemas import SchemaStore

router = APIRouter()

Version = Annotated[int, Path(ge=1, le=1_000_000, description="a schema version (from 1)")]


class IncompatibleSchema(Conflict):
    """A new schema version that the destination's compatibility mode refuses (409); the body
    lists each change and what it breaks."""

    code = "incompatible_schema"

    def __init__(self, message: str, changes: list[Change]) -> None:
        super().__init__(message, field="schema")
        self.changes = changes

    def to_json(self) -> dict[str, Any]:
        return super().to_json() | {"incompatibilities": [c.to_json() for c in self.changes]}


async def _schemas(request: Request) -> SchemaStore:
    return SchemaStore(parts_of(request).service.store)


async def _deletions(request: Request) -> DeletionStore:
    return parts_of(request).deletions


Schemas = Annotated[SchemaStore, Depends(_schemas)]


def schema_view(schema: PayloadSchema) -> dict[str, Any]:
    return schema.model_dump(mode="json", by_alias=True)


async def register_schema(schemas: SchemaStore, code: str, body: SchemaIn,
                          by: str) -> PayloadSchema:
    """Checks `body` against the latest version and stores it as the next one."""
    compile_schema(body.schema_)  # a 422 for what is not a valid draft 2020-12 schema
    latest = await schemas.latest(code)
    mode = body.compatibility or (latest.compatibility if latest else
                                  SchemaCompatibility.BACKWARD)
    if latest is not None:
        broken = incompatibilities(latest.schema_, body.schema_, mode)
        if broken:
            raise IncompatibleSchema(
                f"the schema is not {mode.value} compatible with version {latest.version}: "
                + "; ".join(c.message for c in broken[:5]), broken)
    version = latest.version + 1 if latest else 1
    return await schemas.add(code, body.schema_, mode, version, by)


@router.put("/v1/destinations/{code}/schemas", status_code=201)
async def put_schema(code: DestinationCode, body: SchemaIn, who: ChangesDestination, store: Store,
                     users: Users, schemas: Schemas,
                     deletions: Annotated[DeletionStore, Depends(_deletions)]
                     ) -> dict[str, Any]:
    """Registers a new version of the destination's payload schema (JSON Schema draft
    2020-12). Receivers validate every message against the latest version within a registry
    refresh. A version the compatibility mode refuses is a 409 naming each breaking change."""
    await store.config.get_destination(code)
    await refuse_while_deleting(deletions, code)
    entry = await register_schema(schemas, code, body, who.name)
    await users.audit(who, "schema.put", code, {"version": entry.version,
                                                "compatibility": entry.compatibility.value})
    return schema_view(entry)


@router.get("/v1/destinations/{code}/schemas")
async def list_schemas(code: DestinationCode, _: Catalogue, store: Store,
                       schemas: Schemas) -> list[dict[str, Any]]:
    """Every version of the destination's payload schema, oldest first."""
    await store.config.get_destination(code)
    return [schema_view(s) for s in await schemas.versions(code)]


@router.get("/v1/destinations/{code}/schemas/{version}")
async def get_schema(code: DestinationCode, version: Version, _: Catalogue,
                     schemas: Schemas) -> dict[str, Any]:
    return schema_view(await schemas.get(code, version))


@router.post("/v1/destinations/{code}/schemas/{version}/check")
async def check_body(code: DestinationCode, version: Version, _: Catalogue, schemas: Schemas,
                     body: Annotated[Any, Body(description="a message body (any JSON)")]
                     ) -> dict[str, Any]:
    """Whether `body` passes this version of the schema, and its first error if not."""
    entry = await schemas.get(code, version)
    found = first_error(compile_schema(entry.schema_), body)
    if found is None:
        return {"valid": True, "version": version}
    return {"valid": False, "version": version, "pointer": found.pointer,
            "keyword": found.keyword, "message": found.message}
