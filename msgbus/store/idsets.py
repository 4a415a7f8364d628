"""Reads and updates of documents by a list of `_id`s, a chunk of ids per query.

However long the list (a claim's batch, a sweep's thousands of pending ids), no query carries
more than `IN_CHUNK` ids: what one query asks of the server stays bounded, for a few more round
trips. Why 64, and what it could be on MongoDB: docs/decisions.md, "`$in` queries 64 ids at a
time".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pymongo.asynchronous.collection import AsyncCollection

IN_CHUNK = 64

T = TypeVar("T")
Doc = dict[str, Any]


def chunked(items: Sequence[T], size: int = IN_CHUNK) -> list[Sequence[T]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


async def find_by_ids(collection: AsyncCollection[Doc], ids: Sequence[Any],
                      query: Mapping[str, Any] | None = None,
                      projection: Mapping[str, Any] | None = None) -> list[Doc]:
    """The documents among `ids` that also match `query`."""
    found: list[Doc] = []
    for part in chunked(ids):
        cursor = collection.find({"_id": {"$in": list(part)}, **(query or {})}, projection)
        found += [doc async for doc in cursor]
    return found


async def update_by_ids(collection: AsyncCollection[Doc], ids: Sequence[Any],
                        query: Mapping[str, Any], update: Mapping[str, Any]) -> int:
    """Applies `update` to the documents among `ids` that match `query`; how many changed."""
    modified = 0
    for part in chunked(ids):
        result = await collection.update_many({"_id": {"$in": list(part)}, **query}, update)
        modified += result.modified_count
    return modified
