"""`ProducerStore`: the producer apps (`apps` collection; `_id` is the app's name): the SHA-256
of each of its API keys and the destinations it may publish to. A key is looked up on a
producer's request, through the gate."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from msgbus.errors import Conflict, NotFound
from msgbus.models import ProducerApp, utcnow
from msgbus.store.checked import (
    InvalidDocumentLog,
    Loaded,
    read_each,
    read_one,
    read_valid,
    storable,
)
from msgbus.store.gate import MongoGate
from msgbus.teams import PLATFORM_TEAM

LOOKUP_TIMEOUT_S = 2.0  # a look-up a request waits for (an API key)


class ProducerStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]], gate: MongoGate,
                 invalid_log: InvalidDocumentLog) -> None:
        self._apps = db["apps"]
        self._gate = gate
        self._invalid_log = invalid_log

    async def create_app(self, name: str, key_hash: str, destinations: Sequence[str],
                         team: str = PLATFORM_TEAM) -> None:
        doc = storable({"_id": name, "key_hashes": [key_hash], "team": team,
                        "destinations": list(destinations), "created_at": utcnow()},
                       ProducerApp.model_validate)
        try:
            await self._apps.insert_one(doc)
        except DuplicateKeyError as exc:
            existing = await self._apps.find_one({"_id": name})
            if existing is None or read_valid(existing, "apps", ProducerApp.model_validate,
                                              self._invalid_log) is not None:
                raise Conflict(f"producer app {name!r} already exists", field="name") from exc
            await self._apps.replace_one({"_id": name}, doc)  # it did not validate

    async def replace_app_keys(self, name: str, key_hash: str,
                               destinations: Sequence[str]) -> None:
        """Create the app, or revoke all its keys and give it this one (also the way to
        replace an app whose stored document does not validate)."""
        existing = await self._apps.find_one({"_id": name}, {"created_at": 1})
        created_at = (existing or {}).get("created_at")
        doc = storable({"_id": name, "key_hashes": [key_hash],
                        "destinations": list(destinations),
                        "created_at": created_at if isinstance(created_at, datetime)
                        else utcnow()}, ProducerApp.model_validate)
        await self._apps.replace_one({"_id": name}, doc, upsert=True)

    async def load_apps(self) -> Loaded[ProducerApp]:
        found = [a async for a in self._apps.find({}).sort("_id", ASCENDING)]
        loaded = read_each(found, "apps", ProducerApp.model_validate, self._invalid_log)
        self._invalid_log.whole_collection("apps", loaded.invalid)
        return loaded

    async def get_app(self, name: str) -> ProducerApp:
        doc = await self._apps.find_one({"_id": name})
        if doc is None:
            raise NotFound(f"unknown producer app {name!r}", field="name")
        return read_one(doc, "apps", ProducerApp.model_validate, self._invalid_log)

    async def add_app_key(self, name: str, key_hash: str) -> None:
        """Another key for the app (the old ones keep working until revoked)."""
        await self.get_app(name)  # an app that does not validate is replaced, not extended
        await self._apps.update_one({"_id": name}, {
            "$push": {"key_hashes": key_hash}, "$set": {"revoked_at": None}})

    async def revoke_app_keys(self, name: str) -> None:
        """Every key of the app stops working (receivers notice within their key cache's
        lifetime, 30 s). Works on an app whose document does not validate, too."""
        result = await self._apps.update_one({"_id": name}, {
            "$set": {"key_hashes": [], "revoked_at": utcnow()}})
        if result.matched_count == 0:
            raise NotFound(f"unknown producer app {name!r}", field="name")

    async def find_app_by_key_hash(self, key_hash: str) -> ProducerApp | None:
        """The app holding this key; None also when its document does not validate (its keys
        do not work until it is fixed: reported, never guessed at)."""
        async with self._gate.guard("API key lookup", LOOKUP_TIMEOUT_S):
            doc = await self._apps.find_one({"key_hashes": key_hash})
        if doc is None:
            return None
        return read_valid(doc, "apps", ProducerApp.model_validate, self._invalid_log)
