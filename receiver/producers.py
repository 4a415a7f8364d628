"""Authenticating producer apps by API key, with a short-lived cache of MongoDB lookups.

A key is looked up again once its cache entry is `ttl_s` old, so a revoked key stops working
within `ttl_s`. When MongoDB cannot answer, a key that was known keeps working from the cache
(the bus's promise is to keep accepting messages through a MongoDB outage), while a key never
seen gets 503 (we cannot tell whether it is valid). The outage is logged once, not per request.

Wrong keys from one address are slowed, then that address is locked out for a while (429 with
Retry-After; msgbus/throttle.py), counted in this process: keys are 256-bit random and not
guessed, so this guards the receiver's time, not the keys. Known keys never wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import NoReturn, Protocol

from pymongo.errors import PyMongoError

from msgbus.auth import bearer_token, hash_api_key
from msgbus.errors import Forbidden, MongoUnavailable, Unauthorized, Unavailable
from msgbus.models import Destination, ProducerApp
from msgbus.permissions import check_publish
from msgbus.teams import PLATFORM_TEAM
from msgbus.throttle import MemoryFailures, Policy, Throttle

log = logging.getLogger(__name__)

CACHE_TTL_S = 30.0
OUTAGE_RETRY_AFTER_S = 5
MAX_REMEMBERED_MISSES = 10_000
# wrong keys per address: 20 answered at once, then each waits 0.25 s; from 30, locked
WRONG_KEYS = Policy(free=20, slow_max_s=0.25, lock_after=30, lock_first_s=10.0, lock_max_s=300.0)


@dataclass(frozen=True, slots=True)
class Producer:
    name: str
    destinations: frozenset[str]  # "*" allows every destination
    team: str = PLATFORM_TEAM

    def check_allowed(self, destination: Destination) -> None:
        """Its own list names the destination, and the destination takes its messages."""
        code = destination.code
        if "*" not in self.destinations and code not in self.destinations:
            raise Forbidden(f"producer app {self.name!r} may not send to {code!r}",
                            field="destination")
        check_publish(self.name, self.team, destination)


class AppLookup(Protocol):
    async def find_app_by_key_hash(self, key_hash: str) -> ProducerApp | None: ...


class ProducerAuthenticator:
    def __init__(self, store: AppLookup, *, ttl_s: float = CACHE_TTL_S) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._known: dict[str, tuple[float, Producer]] = {}  # key hash -> (fresh until, app)
        self._misses: dict[str, float] = {}  # key hash -> refused until
        self._lookups: dict[str, asyncio.Task[Producer | None]] = {}
        self._outage: str | None = None  # why MongoDB failed, while it does
        self._wrong_keys = Throttle(MemoryFailures(), {"address": WRONG_KEYS})

    async def authenticate(self, authorization: str | None, address: str = "") -> Producer:
        """The producer whose key `authorization` carries; `address`: the caller's, whose
        wrong keys are throttled."""
        key = bearer_token(authorization)
        if key is None:
            raise Unauthorized("missing 'Authorization: Bearer <api key>' header")
        key_hash = hash_api_key(key)
        known = self._known.get(key_hash)
        if known is not None and known[0] > time.monotonic():
            return known[1]
        if known is None:
            await self._wrong_keys.check({"address": address})
        if known is None and self._misses.get(key_hash, 0.0) > time.monotonic():
            await self._refuse(address)
        lookup = self._start_lookup(key_hash)
        if known is not None:
            # stale while revalidating: a known key never waits for MongoDB (which may be
            # down); the background lookup refreshes it, or forgets it when it was revoked
            return known[1]
        if self._outage is not None:
            # during an outage nobody waits for MongoDB: the lookup runs in the background,
            # and ends the outage when it succeeds
            raise self._unavailable()
        try:
            producer = await asyncio.shield(lookup)
        except (PyMongoError, MongoUnavailable):
            raise self._unavailable() from None
        if producer is None:
            await self._refuse(address)
        return producer

    async def _refuse(self, address: str) -> NoReturn:
        await asyncio.sleep(await self._wrong_keys.failed({"address": address}))
        raise Unauthorized("unknown or revoked API key")

    @staticmethod
    def _unavailable() -> Unavailable:
        return Unavailable("cannot check the API key while MongoDB is unavailable; retry later",
                           retry_after_s=OUTAGE_RETRY_AFTER_S)

    def _start_lookup(self, key_hash: str) -> asyncio.Task[Producer | None]:
        """One MongoDB lookup per key at a time, however many requests want it. A task of its
        own, so that a request that goes away does not cancel it for the others."""
        task = self._lookups.get(key_hash)
        if task is None:
            task = asyncio.create_task(self._fetch(key_hash), name="producer-key-lookup")
            self._lookups[key_hash] = task
            task.add_done_callback(partial(self._lookup_done, key_hash))
        return task

    def _lookup_done(self, key_hash: str, task: asyncio.Task[Producer | None]) -> None:
        self._lookups.pop(key_hash, None)
        if not task.cancelled():
            task.exception()  # retrieved: a background lookup has nobody awaiting it

    async def _fetch(self, key_hash: str) -> Producer | None:
        try:
            app = await self._store.find_app_by_key_hash(key_hash)
        except (PyMongoError, MongoUnavailable) as exc:
            if self._outage is None:
                self._outage = f"{type(exc).__name__}: {exc}"
                log.warning("MongoDB is unavailable for API key checks (%s); known keys keep "
                            "working from the cache, unknown keys get 503", self._outage)
            raise
        if self._outage is not None:
            log.warning("MongoDB answers API key checks again (the outage was: %s)",
                        self._outage)
            self._outage = None
        now = time.monotonic()
        if app is None:
            self._known.pop(key_hash, None)
            if len(self._misses) >= MAX_REMEMBERED_MISSES:
                self._misses.clear()  # random keys must not grow memory without bound
            self._misses[key_hash] = now + self._ttl_s
            return None
        producer = Producer(app.name, frozenset(app.destinations), app.team)
        self._known[key_hash] = (now + self._ttl_s, producer)
        return producer

    async def close(self) -> None:
        tasks = list(self._lookups.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
