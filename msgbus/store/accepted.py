"""`AcceptedIdStore`: the receivers' claims of the message ids they publish, one collection per
window of message creation time (`accepted_ids_<window>`; receiver/dedupe.py says why), each
claim `_id` the message id and `t` the token of the acceptance that claimed it."""

from __future__ import annotations

from typing import Any

from pymongo import WriteConcern
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from msgbus.store.duplicates import DUPLICATE_KEY
from msgbus.store.idsets import find_by_ids

PREFIX = "accepted_ids_"
# Unlike records, a claim lost in a crash of MongoDB costs at most a duplicate push (allowed:
# at-least-once), while waiting for the journal would delay every publish batch
CLAIM_WRITE_CONCERN = WriteConcern(w=1, j=False)


class AcceptedIdStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self._db = db

    async def claim(self, window: int, tokens: dict[str, str]) -> set[str]:
        """Claims the message ids of `tokens` (id -> token) in `window`'s collection with one
        unordered insert; returns those another token claimed first."""
        collection = self._db.get_collection(f"{PREFIX}{window}",
                                             write_concern=CLAIM_WRITE_CONCERN)
        try:
            await collection.insert_many(
                [{"_id": mid, "t": token} for mid, token in tokens.items()], ordered=False)
            return set()
        except BulkWriteError as exc:
            errors: list[dict[str, Any]] = exc.details.get("writeErrors", [])
            if any(e.get("code") != DUPLICATE_KEY for e in errors):
                raise
            claimed = [str(e["op"]["_id"]) for e in errors]
        found = await find_by_ids(collection, claimed, projection={"t": 1})
        return {str(d["_id"]) for d in found if d.get("t") != tokens[str(d["_id"])]}

    async def drop_windows_before(self, oldest_kept: int) -> None:
        """The collections of the windows before `oldest_kept` go, whole."""
        for name in await self._db.list_collection_names():
            if name.startswith(PREFIX) and name[len(PREFIX):].isdigit() and \
                    int(name[len(PREFIX):]) < oldest_kept:
                await self._db.drop_collection(name)
