"""`InvalidDocumentStore`: the stored configuration documents that do not validate, of every
configuration collection (`documents.CONFIG_PARSERS`), for the admin to list and delete
(`GET /v1/invalid-documents`)."""

from __future__ import annotations

from typing import Any

from pymongo import DESCENDING
from pymongo.asynchronous.database import AsyncDatabase

from msgbus.errors import Conflict, NotFound
from msgbus.store import documents as docs
from msgbus.store.checked import InvalidDocument, InvalidDocumentLog, read_each, read_valid

MAX_INVALID_LISTED = 1000


class InvalidDocumentStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]],
                 invalid_log: InvalidDocumentLog) -> None:
        self._db = db
        self._invalid_log = invalid_log

    async def in_collection(self, collection: str,
                            limit: int = MAX_INVALID_LISTED) -> list[InvalidDocument]:
        """The documents of a configuration collection that do not validate (its newest
        `limit` documents are checked: configuration collections are small, replays grow)."""
        parse = docs.CONFIG_PARSERS[collection]
        cursor = self._db[collection].find().sort("_id", DESCENDING).limit(limit)
        loaded = read_each([d async for d in cursor], collection, parse, self._invalid_log)
        return loaded.invalid

    async def in_every_collection(self) -> list[InvalidDocument]:
        """Those of every configuration collection."""
        return [found for collection in docs.CONFIG_PARSERS
                for found in await self.in_collection(collection)]

    async def delete(self, collection: str, doc_id: str) -> None:
        """Deletes a document that does not validate; one that does is refused (409): it is
        changed or deleted through its own API, which audits and cleans up after it."""
        doc = await self._db[collection].find_one({"_id": doc_id})
        if doc is None:
            raise NotFound(f"no {collection} document {doc_id!r}", field="id")
        if read_valid(doc, collection, docs.CONFIG_PARSERS[collection],
                      self._invalid_log) is not None:
            raise Conflict(f"the {collection} document {doc_id!r} is valid: change or delete "
                           "it through its own API", field="id")
        await self._db[collection].delete_one({"_id": doc_id})
