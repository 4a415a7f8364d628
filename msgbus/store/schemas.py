"""`SchemaStore`: the versions of each destination's payload schema (`schemas` collection).

One document per version, `_id` `<code>/<version>`, never changed once written: a message
records the version it passed, so the version must keep meaning what it meant. The schema is
kept as JSON text (`documents.schema_doc`). A stored version that does not validate is left out
and listed with the other invalid configuration documents (`GET /v1/invalid-documents`).

Registering checks compatibility against the latest version (the admin does, admin/schemas.py)
and inserts the next number; two registrations racing for one number meet on the unique
`_id`, and the loser gets a 409 to retry against the new latest.
"""

from __future__ import annotations

from typing import Any

from pymongo import ASCENDING
from pymongo.errors import DuplicateKeyError

from msgbus.errors import Conflict, NotFound
from msgbus.models import PayloadSchema, SchemaCompatibility, payload_schema_id, utcnow
from msgbus.store.checked import read_each, read_one, storable
from msgbus.store.documents import schema_doc, schema_from_doc
from msgbus.store.mongo import MongoStore

COLLECTION = "schemas"


class SchemaStore:
    def __init__(self, store: MongoStore) -> None:
        self._schemas = store.db[COLLECTION]
        self._invalid_log = store.invalid_log

    async def versions(self, destination: str) -> list[PayloadSchema]:
        """Every version of the destination's schema, oldest first."""
        cursor = self._schemas.find({"destination": destination}).sort("version", ASCENDING)
        loaded = read_each([d async for d in cursor], COLLECTION, schema_from_doc,
                           self._invalid_log)
        return loaded.items

    async def get(self, destination: str, version: int) -> PayloadSchema:
        doc = await self._schemas.find_one({"_id": payload_schema_id(destination, version)})
        if doc is None:
            raise NotFound(f"destination {destination!r} has no schema version {version}",
                           field="version")
        return read_one(doc, COLLECTION, schema_from_doc, self._invalid_log)

    async def latest(self, destination: str) -> PayloadSchema | None:
        found = [d async for d in self._schemas.find({"destination": destination}, {
            "version": 1}).sort("version", -1).limit(1)]
        return await self.get(destination, found[0]["version"]) if found else None

    async def add(self, destination: str, schema: dict[str, Any] | bool,
                  compatibility: SchemaCompatibility, version: int, by: str) -> PayloadSchema:
        """Stores `version` (the latest + 1, as the caller checked it); a 409 when another
        registration took that number first."""
        entry = PayloadSchema(destination=destination, version=version, schema=schema,
                              compatibility=compatibility, created_at=utcnow(), created_by=by)
        try:
            await self._schemas.insert_one(storable(schema_doc(entry), schema_from_doc))
        except DuplicateKeyError as exc:
            raise Conflict(f"version {version} of {destination!r}'s schema was registered "
                           "meanwhile; check against it and try again",
                           field="version") from exc
        return entry

    async def latest_versions(self) -> dict[str, int]:
        """The latest version of every destination's schema (versions only: the registry
        asks every refresh, and fetches the schema of a version it does not have)."""
        latest: dict[str, int] = {}
        async for doc in self._schemas.find({}, {"destination": 1, "version": 1}):
            code, version = doc.get("destination"), doc.get("version")
            if isinstance(code, str) and isinstance(version, int):
                latest[code] = max(version, latest.get(code, 0))
        return latest

    async def delete_destination(self, destination: str) -> None:
        """A deleted destination's versions go with it."""
        await self._schemas.delete_many({"destination": destination})
