"""`Registry`: an in-memory copy of destinations, subscriptions and the runtime knobs,
refreshed from MongoDB.

Services read configuration from here on their hot paths; a change made through the admin API
reaches them within `refresh_s` (or at once for a destination the registry has not seen yet).
A stored document that does not validate is left out (the store reports it once per change):
the rest of the configuration is served as usual.

With a `snapshot` path, every configuration loaded is also saved there (owner-only: it holds
the subscriptions' signing secrets), and a service that starts while MongoDB is down serves
the saved one until MongoDB answers: a dispatcher restarted during an outage keeps pushing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError
from pymongo.errors import PyMongoError, ServerSelectionTimeoutError

from msgbus.errors import InvalidStoredDocument, MongoUnavailable, NotFound, Unavailable
from msgbus.models import Destination, PayloadSchema, RuntimeConfig, Subscription
from msgbus.store import MongoStore
from msgbus.store.schemas import SchemaStore
from msgbus.tasks import PeriodicWork

log = logging.getLogger(__name__)

MISS_RETRY_S = 1.0
READ_TIMEOUT_S = 5.0  # the whole configuration, read through the store's gate
LOOKUP_TIMEOUT_S = 2.0  # one destination not known yet (a producer's request waits for it)
MAX_REMEMBERED_MISSES = 10_000
MISCONFIGURED_RETRY_AFTER_S = 30

ChangeListener = Callable[[], Awaitable[None]]


class Registry:
    def __init__(self, store: MongoStore, *, refresh_s: float,
                 snapshot: Path | None = None, payload_schemas: bool = False) -> None:
        self._store = store
        # the latest payload schema of each destination that has one, for the services that
        # validate bodies (the receiver): loaded only when asked for
        self._schema_store = SchemaStore(store) if payload_schemas else None
        self._schemas: dict[str, PayloadSchema] = {}
        self._refresh_s = refresh_s
        self._snapshot = snapshot
        self._destinations: dict[str, Destination] = {}
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._runtime = RuntimeConfig()
        self._listeners: list[ChangeListener] = []
        # meanwhile, and while MongoDB's gate is closed: the last configuration
        self._refresh = PeriodicWork()
        self._refresh.every(refresh_s, self._refresh_once, what="registry refresh",
                            ready=store.gate.wait_available, first_pause=True)
        self._misses: dict[str, float] = {}  # code -> when to look it up again
        # monotonic time of the last read of MongoDB that is served and acted on (listeners
        # done): a change written before it is in effect here
        self.current_as_of = 0.0

    def on_change(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: ChangeListener) -> None:
        """Stop calling `listener` (e.g. the pipeline of an adopted buffer, once flushed)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def start(self) -> None:
        """Loads the configuration; when MongoDB is down, starts empty and keeps trying."""
        try:
            if self._snapshot is not None and not await self._store.ping():
                # a quick answer instead of the driver's server selection timeout
                raise ServerSelectionTimeoutError("MongoDB does not answer a ping")
            await self.reload()
        except (PyMongoError, MongoUnavailable) as exc:
            log.warning("registry: MongoDB is unreachable (%s); retrying every %.1fs",
                        type(exc).__name__, self._refresh_s)
            await self._load_snapshot()
        self._refresh.start()

    async def close(self) -> None:
        await self._refresh.close()

    async def reload(self) -> None:
        read_at = time.monotonic()
        async with self._store.gate.guard("configuration", READ_TIMEOUT_S):
            destinations = await self._store.config.list_destinations()
            subscriptions = await self._store.config.list_subscriptions()
            schemas_changed = await self._reload_schemas()
            runtime = await self._store.config.get_runtime()
        changed = self._apply(destinations, subscriptions, runtime) or schemas_changed
        if changed or (self._snapshot is not None and not self._snapshot.exists()):
            self._save_snapshot()
        if changed:
            await self._notify()
        self.current_as_of = read_at

    async def _reload_schemas(self) -> bool:
        """Follows the latest schema versions: one read of the versions, and the schema of a
        version not held yet. Returns whether any changed."""
        if self._schema_store is None:
            return False
        latest = await self._schema_store.latest_versions()
        schemas: dict[str, PayloadSchema] = {}
        for code, version in latest.items():
            held = self._schemas.get(code)
            if held is not None and held.version == version:
                schemas[code] = held
                continue
            try:
                schemas[code] = await self._schema_store.get(code, version)
            except (NotFound, InvalidStoredDocument):  # reported by the store
                # the newest version that reads back: a broken one never turns validation off
                valid = await self._schema_store.versions(code)
                if valid:
                    schemas[code] = valid[-1]
        changed = schemas != self._schemas
        self._schemas = schemas
        return changed

    def payload_schema(self, code: str) -> PayloadSchema | None:
        """The latest version of the destination's payload schema; None when it has none."""
        return self._schemas.get(code)

    def _apply(self, destinations: list[Destination], subscriptions: list[Subscription],
               runtime: RuntimeConfig) -> bool:
        """Serve this configuration from now on; returns whether it differs."""
        by_code = {d.code: d for d in destinations}
        by_destination: dict[str, list[Subscription]] = {}
        for sub in subscriptions:
            by_destination.setdefault(sub.destination, []).append(sub)
        changed = (by_code != self._destinations or by_destination != self._subscriptions
                   or runtime != self._runtime)
        self._destinations, self._subscriptions = by_code, by_destination
        self._runtime = runtime
        return changed

    async def _notify(self) -> None:
        for listener in list(self._listeners):  # one may remove itself meanwhile
            await listener()

    def _save_snapshot(self) -> None:
        if self._snapshot is None:
            return
        state = {"destinations": [d.model_dump(mode="json") for d in self.destinations()],
                 "subscriptions": [s.model_dump(mode="json") for s in self.subscriptions()],
                 "runtime": self._runtime.model_dump(mode="json"),
                 "schemas": [s.model_dump(mode="json", by_alias=True)
                             for s in self._schemas.values()]}
        try:
            self._snapshot.parent.mkdir(parents=True, exist_ok=True)
            partial = self._snapshot.with_name(self._snapshot.name + ".partial")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(orjson.dumps(state))
            partial.replace(self._snapshot)
        except OSError as exc:  # the live configuration still works
            log.warning("registry: cannot save the configuration to %s: %s", self._snapshot, exc)

    async def _load_snapshot(self) -> None:
        """The configuration saved by an earlier run, served until MongoDB answers."""
        if self._snapshot is None or not self._snapshot.exists():
            return
        try:
            state: dict[str, Any] = orjson.loads(self._snapshot.read_bytes())
            destinations = [Destination.model_validate(d) for d in state["destinations"]]
            subscriptions = [Subscription.model_validate(s) for s in state["subscriptions"]]
            runtime = RuntimeConfig.model_validate(state["runtime"])
            schemas = [PayloadSchema.model_validate(s) for s in state.get("schemas", [])]
        except (OSError, ValueError, KeyError, ValidationError) as exc:
            log.warning("registry: the saved configuration %s is unusable: %s",
                        self._snapshot, exc)
            return
        log.warning("registry: serving the configuration saved at %s (%d destinations, %d "
                    "subscriptions) until MongoDB answers", time.ctime(
                        self._snapshot.stat().st_mtime), len(destinations), len(subscriptions))
        if self._schema_store is not None:
            self._schemas = {s.destination: s for s in schemas}
        if self._apply(destinations, subscriptions, runtime):
            await self._notify()

    async def _refresh_once(self) -> None:
        try:
            await self.reload()
        except MongoUnavailable as exc:
            log.warning("registry refresh: %s; keeping the last configuration", exc)
        except Exception:  # MongoDB down: keep serving the last known configuration
            log.warning("registry refresh failed; keeping the last configuration",
                        exc_info=True)

    async def destination(self, code: str) -> Destination:
        """The destination. One not known yet is looked up in MongoDB, at most once a second
        per code, so that a new destination works at once and unknown ones stay cheap."""
        found = self._destinations.get(code)
        if found is not None:
            return found
        now = time.monotonic()
        if self._misses.get(code, 0.0) <= now:
            if len(self._misses) > MAX_REMEMBERED_MISSES:
                self._misses.clear()
            self._misses[code] = now + MISS_RETRY_S
            with contextlib.suppress(NotFound):
                try:
                    async with self._store.gate.guard("destination lookup", LOOKUP_TIMEOUT_S):
                        looked_up = await self._store.config.get_destination(code)
                except InvalidStoredDocument as exc:
                    # not the sender's fault, and fixed by an operator: the sender keeps the
                    # message and tries again
                    raise Unavailable(f"destination {code!r} is misconfigured ({exc.message})",
                                      retry_after_s=MISCONFIGURED_RETRY_AFTER_S) from exc
                self._destinations[code] = looked_up
                return looked_up
        raise NotFound(f"unknown destination {code!r}", field="destination")

    def known_destination(self, code: str) -> Destination | None:
        """The destination if the registry has it, without asking MongoDB."""
        return self._destinations.get(code)

    def runtime(self) -> RuntimeConfig:
        return self._runtime

    def destinations(self) -> list[Destination]:
        return list(self._destinations.values())

    def subscriptions_of(self, destination: str) -> list[Subscription]:
        return self._subscriptions.get(destination, [])

    def subscriptions(self) -> list[Subscription]:
        return [sub for subs in self._subscriptions.values() for sub in subs]

    def subscription(self, sub_id: str) -> Subscription | None:
        destination = sub_id.split("/", 1)[0]
        return next((s for s in self.subscriptions_of(destination) if s.id == sub_id), None)
