"""`subscriptions_matching`: which of some subscriptions have a document matching a query.

Two ways to find them, the same answer:

- **walk** (for MongoDB): along an index that begins with `subscription`, one look-up per
  subscription found, each asking for the first matching document past the last one found,
  sorted by subscription. The index bounds on the fields after `subscription` let the server
  seek past what does not match instead of reading it, so a pass costs one look-up per
  subscription that has something, plus one: idle subscriptions cost nothing, however many
  there are and however much each has stored.
- **each** (for the development stand-in, SecantusDB): one look-up per candidate subscription
  and status, each an equality on both (its planner scans the whole collection for the walk's
  query: 0.7-4.7 s over 50,000 deliveries, against ~1 ms for an equality look-up).

`MSGBUS_MONGO_INDEX_SKIP_SCANS` picks (docs/decisions.md, "Scans across subscriptions").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.collection import AsyncCollection


async def subscriptions_matching(collection: AsyncCollection[dict[str, Any]],
                                 query: dict[str, Any], index: list[tuple[str, int]],
                                 candidates: Iterable[str], *, walk: bool,
                                 after: str | None = None, limit: int | None = None
                                 ) -> list[str]:
    """Up to `limit` (None: all) subscriptions in order, from the first after `after`, that
    have a document matching `query` (which must not name `subscription`). A walk may name
    subscriptions that are not among `candidates`; the other way looks at those only."""
    if walk:
        return await _walk(collection, query, index, after, limit)
    return await _each(collection, query, candidates, after, limit)


async def _walk(collection: AsyncCollection[dict[str, Any]], query: dict[str, Any],
                index: list[tuple[str, int]], after: str | None, limit: int | None
                ) -> list[str]:
    found: list[str] = []
    while limit is None or len(found) < limit:
        last = found[-1] if found else after
        scoped = query if last is None else query | {"subscription": {"$gt": last}}
        doc = await collection.find_one(scoped, {"_id": 0, "subscription": 1},
                                        sort=[("subscription", ASCENDING)], hint=index)
        if doc is None:
            return found
        found.append(doc["subscription"])
    return found


async def _each(collection: AsyncCollection[dict[str, Any]], query: dict[str, Any],
                candidates: Iterable[str], after: str | None, limit: int | None) -> list[str]:
    found: list[str] = []
    for sub in sorted(set(candidates)):
        if limit is not None and len(found) >= limit:
            break
        if (after is None or sub > after) and await _has_match(collection, sub, query):
            found.append(sub)
    return found


async def _has_match(collection: AsyncCollection[dict[str, Any]], sub: str,
                     query: dict[str, Any]) -> bool:
    status = query.get("status")
    values = status["$in"] if isinstance(status, dict) else [status]
    for value in values:
        scoped = query | {"subscription": sub}
        if value is not None:
            scoped["status"] = value
        if await collection.find_one(scoped, {"_id": 1}) is not None:
            return True
    return False
