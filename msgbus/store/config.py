"""`ConfigStore`: the bus's configuration — destinations, subscriptions and the runtime knobs
operators change at runtime (`runtime`: one document). Every read checks what it reads
(`msgbus/store/checked.py`): a document that does not validate is left out and reported, and
nothing is written that would not read back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase

from msgbus.errors import InvalidStoredDocument, NotFound
from msgbus.models import (
    Destination,
    RetiredBroker,
    RuntimeConfig,
    Subscription,
    subscription_id,
)
from msgbus.push_credentials import MASK
from msgbus.store import documents as docs
from msgbus.store.checked import InvalidDocumentLog, Loaded, read_each, read_one, storable


class ConfigStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]],
                 invalid_log: InvalidDocumentLog, seal: Callable[[str], str]) -> None:
        self._destinations = db["destinations"]
        self._subscriptions = db["subscriptions"]
        self._runtime = db["runtime"]
        self._invalid_log = invalid_log
        self._seal = seal  # secrets are stored sealed (msgbus/sealing.py)

    # --- destinations ----------------------------------------------------------------------

    async def save_destination(self, destination: Destination) -> None:
        doc = storable(docs.destination_doc(destination), docs.destination_from_doc)
        await self._destinations.replace_one({"_id": doc["_id"]}, doc, upsert=True)

    async def get_destination(self, code: str) -> Destination:
        doc = await self._destinations.find_one({"_id": code})
        if doc is None:
            raise NotFound(f"unknown destination {code!r}", field="destination")
        return read_one(doc, "destinations", docs.destination_from_doc, self._invalid_log)

    async def load_destinations(self) -> Loaded[Destination]:
        """Every destination that validates, and those left out (reported)."""
        found = [d async for d in self._destinations.find().sort("_id", ASCENDING)]
        loaded = read_each(found, "destinations", docs.destination_from_doc, self._invalid_log)
        self._invalid_log.whole_collection("destinations", loaded.invalid)
        return loaded

    async def list_destinations(self) -> list[Destination]:
        return (await self.load_destinations()).items

    async def delete_destination(self, code: str) -> None:
        await self._destinations.delete_one({"_id": code})

    async def drop_retired_broker(self, code: str, retired: RetiredBroker) -> None:
        """The destination no longer lists `retired` (every subscription drained it)."""
        entry: dict[str, Any] = {"broker": retired.broker.value,
                                 "retired_at": retired.retired_at}
        await self._destinations.update_one({"_id": code}, {"$pull": {"retired": entry}})

    # --- subscriptions ---------------------------------------------------------------------

    async def save_subscription(self, subscription: Subscription) -> None:
        if subscription.auth is not None and MASK in subscription.auth.secret_places().values():
            raise ValueError("a masked secret reached the store (PushAuth.keeping not applied)")
        sealed = subscription.model_copy(update={
            "signing_secrets": [self._seal(s) for s in subscription.signing_secrets],
            "auth": subscription.auth and subscription.auth.with_secrets(self._seal)})
        doc = storable(docs.subscription_doc(sealed), docs.subscription_from_doc)
        await self._subscriptions.replace_one({"_id": doc["_id"]}, doc, upsert=True)

    async def load_subscriptions(self, destination: str | None = None) -> Loaded[Subscription]:
        """The subscriptions (of `destination`, or all) that validate, and those left out."""
        query = {} if destination is None else {"destination": destination}
        found = [d async for d in self._subscriptions.find(query).sort("_id", ASCENDING)]
        loaded = read_each(found, "subscriptions", docs.subscription_from_doc,
                           self._invalid_log)
        if destination is None:
            self._invalid_log.whole_collection("subscriptions", loaded.invalid)
        return loaded

    async def list_subscriptions(self, destination: str | None = None) -> list[Subscription]:
        return (await self.load_subscriptions(destination)).items

    async def get_subscription(self, sub_id: str) -> Subscription:
        doc = await self._subscriptions.find_one({"_id": sub_id})
        if doc is None:
            raise NotFound(f"unknown subscription {sub_id!r}", field="subscription")
        return read_one(doc, "subscriptions", docs.subscription_from_doc, self._invalid_log)

    async def subscription_team(self, code: str, name: str) -> str:
        """The team that owns subscription `code/name`: its own; one stored before teams, or
        whose stored document does not validate, belongs to its destination's (NotFound when
        neither exists)."""
        try:
            team = (await self.get_subscription(subscription_id(code, name))).team
        except InvalidStoredDocument:
            team = None
        return team or (await self.get_destination(code)).team

    async def stored_subscription(self, sub_id: str) -> dict[str, Any] | None:
        """The subscription's document as stored, unchecked (None: there is none): what a
        replacement of one that does not validate may keep of it."""
        return await self._subscriptions.find_one({"_id": sub_id})

    async def delete_subscription(self, sub_id: str) -> None:
        await self._subscriptions.delete_one({"_id": sub_id})

    # --- runtime ---------------------------------------------------------------------------

    async def get_runtime(self) -> RuntimeConfig:
        """The runtime knobs; the defaults while none are stored or what is stored does not
        validate (reported)."""
        doc = await self._runtime.find_one({"_id": docs.RUNTIME_ID})
        loaded = read_each([doc] if doc else [], "runtime", docs.runtime_from_doc,
                           self._invalid_log)
        self._invalid_log.whole_collection("runtime", loaded.invalid)
        return loaded.items[0] if loaded.items else RuntimeConfig()

    async def save_runtime(self, config: RuntimeConfig) -> None:
        doc = storable(docs.runtime_doc(config), docs.runtime_from_doc)
        await self._runtime.replace_one({"_id": docs.RUNTIME_ID}, doc, upsert=True)
