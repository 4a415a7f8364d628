"""The cross-receiver claim of message ids (receiver/dedupe.py) against a real MongoDB server:
the first acceptance publishes, another receiver's copy does not, the same acceptance again
(a restart, an adopted buffer) does, and without MongoDB everything is published."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from msgbus.ids import uuid7
from msgbus.models import Envelope, utcnow
from msgbus.store import MongoStore
from receiver.dedupe import AcceptedIds, buffer_origin


def _envelopes(ids: list[str], received_delta_s: float) -> list[Envelope]:
    received = utcnow() + timedelta(seconds=received_delta_s)
    return [Envelope(message_id=m, destination="d", body=b"{}", received_at=received)
            for m in ids]


@pytest.fixture
async def store(mongo_uri: str, mongo_db_name: str) -> MongoStore:
    found = MongoStore(mongo_uri, mongo_db_name)
    await found.ensure_indexes()
    return found


async def test_only_the_first_acceptance_of_an_id_is_published(store: MongoStore) -> None:
    ids = [uuid7() for _ in range(300)]
    first, other = AcceptedIds(store, 600, "a"), AcceptedIds(store, 600, "b")
    at_a = _envelopes(ids[:200], 0)
    assert await first.first_accepts(at_a) == at_a
    # a re-send of 200 of them, and 100 new ones, at another receiver in the same millisecond
    at_b = _envelopes(ids, 0)
    for envelope in at_b:
        envelope.received_at = at_a[0].received_at
    published = await other.first_accepts(at_b)
    assert [e.message_id for e in published] == ids[200:]
    # receiver A publishing its buffer again (a restart) still publishes its own
    assert await first.first_accepts(at_a) == at_a
    await store.close()


async def test_without_mongodb_everything_is_published() -> None:
    unreachable = MongoStore("mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=300", "x")
    envelopes = _envelopes([uuid7(), uuid7()], 0)
    assert await AcceptedIds(unreachable, 600, "a").first_accepts(envelopes) == envelopes
    await unreachable.close()


async def test_the_claims_of_old_windows_are_dropped(store: MongoStore) -> None:
    ancient = store.db["accepted_ids_1"]  # a window of 1970
    await ancient.insert_one({"_id": "m", "t": 1})
    await AcceptedIds(store, 600, "a").first_accepts(_envelopes([uuid7()], 0))
    names = await store.db.list_collection_names()
    assert "accepted_ids_1" not in names
    assert any(n.startswith("accepted_ids_") for n in names)
    await store.close()


def test_a_buffer_keeps_its_origin(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = buffer_origin(tmp_path / "a")
    assert buffer_origin(tmp_path / "a") == first  # a restart or an adopter reads the same
    assert buffer_origin(tmp_path / "b") != first
