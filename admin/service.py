"""`AdminService`: what the management API does beyond plain reads and writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from msgbus.auth import hash_api_key, new_api_key
from msgbus.settings import AdminSettings
from msgbus.store import MongoStore


class AdminService:
    def __init__(self, settings: AdminSettings) -> None:
        if not settings.token.get_secret_value():
            raise ValueError("MSGBUS_ADMIN_TOKEN is not set")
        self.settings = settings
        self.store = MongoStore(settings.connections.mongo_uri, settings.connections.mongo_db)

    async def start(self) -> None:
        await self.store.ensure_indexes()

    async def close(self) -> None:
        await self.store.close()

    async def create_producer_app(self, name: str, destinations: Sequence[str]) -> str:
        key = new_api_key()
        await self.store.create_app(name, hash_api_key(key), destinations)
        return key

    @staticmethod
    def message_summary(doc: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in doc.items() if k not in ("body", "_id")} | {
            "message_id": doc["_id"]}

    async def message_timeline(self, message_id: str) -> dict[str, Any]:
        message = await self.store.get_message(message_id)
        body = bytes(message["body"])
        summary = self.message_summary(message)
        summary["body"] = body.decode("utf-8", "replace")
        deliveries = await self.store.deliveries_of(message_id)
        attempts = await self.store.attempts_of(message_id)
        for d in deliveries:
            d.pop("_id", None)
            d["attempts_log"] = [
                {k: v for k, v in a.items() if k not in ("_id", "message_id", "subscription")}
                for a in attempts if a["subscription"] == d["subscription"]]
        return {"message": summary, "deliveries": deliveries}
