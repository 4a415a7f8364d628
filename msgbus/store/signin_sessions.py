"""`CompanySessions`: the sessions of people who signed in through the company's identity
provider (`oidc_sessions`; `_id` is the session id): whose, and the provider's refresh token,
encrypted (Fernet, with a key derived from the admin's session secret), with which the admin
reads their groups again every so often (admin/oidc.py). A session goes by itself (TTL) when
its cookie would have expired."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

from msgbus.sealing import SecretKeyError, SecretKeys, is_sealed

INDEXES = [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0)]  # store/indexes.py


class CompanySessions:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self._sessions = db["oidc_sessions"]

    async def save(self, session_id: str, user: str, refresh_token: str | None,
                   refresh_at: datetime, expires_at: datetime, keys: SecretKeys) -> None:
        secret = None if refresh_token is None else keys.seal(refresh_token)
        await self._sessions.replace_one({"_id": session_id}, {
            "_id": session_id, "user": user, "refresh_token": secret,
            "refresh_at": refresh_at, "expires_at": expires_at}, upsert=True)

    async def get(self, session_id: str) -> dict[str, Any] | None:
        doc: dict[str, Any] | None = await self._sessions.find_one({"_id": session_id})
        return doc

    @staticmethod
    def refresh_token(doc: dict[str, Any], keys: SecretKeys) -> str | None:
        """The session's refresh token (None: none, or not readable with these keys, e.g.
        one stored before 0.2 under a key of its own: that person signs in again)."""
        stored = doc.get("refresh_token")
        if not isinstance(stored, str) or not is_sealed(stored):
            return None
        try:
            return keys.open(stored)
        except SecretKeyError:
            return None

    async def delete(self, session_id: str) -> None:
        await self._sessions.delete_one({"_id": session_id})
