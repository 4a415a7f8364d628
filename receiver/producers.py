"""Authenticating producer apps by API key, with a short-lived cache of MongoDB lookups."""

from __future__ import annotations

import time
from dataclasses import dataclass

from msgbus.auth import bearer_token, hash_api_key
from msgbus.errors import Forbidden, Unauthorized
from msgbus.store import MongoStore

CACHE_TTL_S = 30.0


@dataclass(frozen=True, slots=True)
class Producer:
    name: str
    destinations: frozenset[str]  # "*" allows every destination

    def check_allowed(self, destination: str) -> None:
        if "*" not in self.destinations and destination not in self.destinations:
            raise Forbidden(f"producer app {self.name!r} may not send to {destination!r}",
                            field="destination")


class ProducerAuthenticator:
    def __init__(self, store: MongoStore) -> None:
        self._store = store
        self._cache: dict[str, tuple[float, Producer | None]] = {}

    async def authenticate(self, authorization: str | None) -> Producer:
        key = bearer_token(authorization)
        if key is None:
            raise Unauthorized("missing 'Authorization: Bearer <api key>' header")
        key_hash = hash_api_key(key)
        cached = self._cache.get(key_hash)
        if cached is not None and cached[0] > time.monotonic():
            producer = cached[1]
        else:
            doc = await self._store.find_app_by_key_hash(key_hash)
            producer = None if doc is None else Producer(doc["_id"], frozenset(doc["destinations"]))
            self._cache[key_hash] = (time.monotonic() + CACHE_TTL_S, producer)
        if producer is None:
            raise Unauthorized("unknown or revoked API key")
        return producer
