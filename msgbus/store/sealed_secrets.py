"""`reseal_secrets`: every secret stored in MongoDB sealed with the newest key (msgbus/sealing.py).
The admin runs it at start (a value stored plain before 0.2 is sealed then) and on
`POST /v1/secrets/reseal` (`msgbus secrets rotate-key`), after a new key was put first: once it
reports nothing left under an older key, that key may go."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from msgbus.push_credentials import PushAuth
from msgbus.sealing import SecretKeys, key_id_of

# collection -> the fields holding secrets: a value, a list of them, or a PushAuth
SECRET_FIELDS = {"subscriptions": ("signing_secrets", "auth"), "teams": ("notify_secret",),
                 "oidc_sessions": ("refresh_token",)}


@dataclass
class Resealed:
    resealed: int  # documents written again
    left: int  # values still plain or under an older key (0 once done)
    key_id: str  # the key everything is sealed with now

    def as_dict(self) -> dict[str, Any]:
        return {"resealed": self.resealed, "left": self.left, "key_id": self.key_id}


def _each_secret(value: Any, change: Callable[[str], str]) -> Any:
    """`value` (a field of SECRET_FIELDS, as stored) with `change` applied to its secrets."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, bytes):  # a refresh token stored before 0.2: never read again
        return value
    if isinstance(value, list):
        return [change(v) for v in value]
    if isinstance(value, dict):
        return PushAuth.model_validate(value).with_secrets(change).model_dump(mode="json")
    return value  # None: not set


async def _documents(db: AsyncDatabase[dict[str, Any]]) -> Any:
    for collection, names in SECRET_FIELDS.items():
        query = {"$or": [{name: {"$exists": True, "$ne": None}} for name in names]}
        async for doc in db[collection].find(query, dict.fromkeys(names, 1)):
            yield collection, {name: doc[name] for name in names if doc.get(name) is not None}, \
                doc["_id"]


async def reseal_secrets(db: AsyncDatabase[dict[str, Any]], keys: SecretKeys) -> Resealed:
    resealed = 0
    async for collection, fields, doc_id in _documents(db):
        again = {name: _each_secret(value, keys.reseal) for name, value in fields.items()}
        if again == fields:
            continue
        # only if unchanged meanwhile: a rotation by an admin wins, and is sealed already
        done = await db[collection].update_one({"_id": doc_id, **fields}, {"$set": again})
        resealed += done.modified_count
    return Resealed(resealed, await _left_unsealed(db, keys), keys.current)


async def _left_unsealed(db: AsyncDatabase[dict[str, Any]], keys: SecretKeys) -> int:
    """Values still plain or under an older key (e.g. written meanwhile by an admin that does
    not have the newest key yet)."""
    count = 0

    def note(value: str) -> str:
        nonlocal count
        count += key_id_of(value) != keys.current
        return value

    async for _, fields, _ in _documents(db):
        for value in fields.values():
            _each_secret(value, note)
    return count
