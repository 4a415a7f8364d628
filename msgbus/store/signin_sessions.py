"""`CompanySessions`: the sessions of people who signed in through the company's identity
provider (`oidc_sessions`; `_id` is the session id): whose, and the provider's refresh token,
encrypted (Fernet, with a key derived from the admin's session secret), with which the admin
reads their groups again every so often (admin/oidc.py). A session goes by itself (TTL) when
its cookie would have expired."""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

INDEXES = [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0)]  # store/indexes.py


def fernet_of(secret: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"msgbus-oidc:" + secret.encode()
                                                          ).digest()))


class CompanySessions:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self._sessions = db["oidc_sessions"]

    async def save(self, session_id: str, user: str, refresh_token: str | None,
                   refresh_at: datetime, expires_at: datetime, fernet: Fernet) -> None:
        secret = None if refresh_token is None else fernet.encrypt(refresh_token.encode())
        await self._sessions.replace_one({"_id": session_id}, {
            "_id": session_id, "user": user, "refresh_token": secret,
            "refresh_at": refresh_at, "expires_at": expires_at}, upsert=True)

    async def get(self, session_id: str) -> dict[str, Any] | None:
        doc: dict[str, Any] | None = await self._sessions.find_one({"_id": session_id})
        return doc

    @staticmethod
    def refresh_token(doc: dict[str, Any], fernet: Fernet) -> str | None:
        """The session's refresh token (None: none, or not readable with this key)."""
        if doc.get("refresh_token") is None:
            return None
        try:
            return fernet.decrypt(doc["refresh_token"]).decode()
        except InvalidToken:
            return None

    async def delete(self, session_id: str) -> None:
        await self._sessions.delete_one({"_id": session_id})
