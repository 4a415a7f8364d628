"""`reseal_secrets`: every secret stored in MongoDB sealed with the newest key (msgbus/sealing.py).
The admin runs it at start (a value stored plain before 0.2 is sealed then) and on
`POST /v1/secrets/reseal` (`msgbus secrets rotate-key`), after a new key was put first: once it
reports nothing left under an older key, that key may go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from msgbus.sealing import SecretKeys, key_id_of

# collection -> the fields holding a secret (a list of them, or one)
SECRET_FIELDS = {"subscriptions": "signing_secrets", "teams": "notify_secret"}


@dataclass
class Resealed:
    resealed: int  # documents written again
    left: int  # values still plain or under an older key (0 once done)
    key_id: str  # the key everything is sealed with now

    def as_dict(self) -> dict[str, Any]:
        return {"resealed": self.resealed, "left": self.left, "key_id": self.key_id}


async def reseal_secrets(db: AsyncDatabase[dict[str, Any]], keys: SecretKeys) -> Resealed:
    resealed = 0
    for collection, name in SECRET_FIELDS.items():
        async for doc in db[collection].find({name: {"$exists": True, "$ne": None}},
                                             {name: 1}):
            value = doc[name]
            again = ([keys.reseal(v) for v in value] if isinstance(value, list)
                     else keys.reseal(value))
            if again == value:
                continue
            # only if unchanged meanwhile: a rotation by an admin wins, and is sealed already
            done = await db[collection].update_one({"_id": doc["_id"], name: value},
                                                   {"$set": {name: again}})
            resealed += done.modified_count
    return Resealed(resealed, await _left_unsealed(db, keys), keys.current)


async def _left_unsealed(db: AsyncDatabase[dict[str, Any]], keys: SecretKeys) -> int:
    """Values still plain or under an older key (e.g. written meanwhile by an admin that does
    not have the newest key yet)."""
    count = 0
    for collection, name in SECRET_FIELDS.items():
        async for doc in db[collection].find({name: {"$exists": True, "$ne": None}},
                                             {name: 1}):
            values = doc[name] if isinstance(doc[name], list) else [doc[name]]
            count += sum(1 for v in values if key_id_of(v) != keys.current)
    return count
