"""`MongoGate` against a real MongoDB-protocol server behind a `TcpGate`: a hung server costs
one timeout, then every caller is refused at once until a probe finds it back; a refused
connection closes the gate at once; an answer, however slow, never does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from msgbus_devtools.testkit.tcp_gate import TcpGate, mongo_uri_through
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.errors import MongoUnavailable
from msgbus.store import MongoStore

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 1.0
CALLS = 20


@pytest.fixture
async def gated(mongo_gate: TcpGate, mongo_db_name: str
                ) -> AsyncIterator[tuple[TcpGate, MongoStore]]:
    store = MongoStore(mongo_uri_through(mongo_gate), mongo_db_name, component="test")
    assert await store.ping()
    try:
        yield mongo_gate, store
    finally:
        mongo_gate.thaw()
        mongo_gate.open()
        await store.close()


async def _insert(store: MongoStore, n: int) -> MongoUnavailable | None:
    """One guarded insert: None when it got in, else why not."""
    try:
        async with store.gate.guard("test insert", CALL_TIMEOUT_S):
            await store.db["gate_test"].insert_one({"n": n})
    except MongoUnavailable as exc:
        return exc
    return None


async def test_a_hung_server_costs_one_timeout_then_callers_are_refused_at_once(
        gated: tuple[TcpGate, MongoStore]) -> None:
    tcp, store = gated
    tcp.freeze()
    first = await _insert(store, 0)
    assert first is not None and "within 1 s" in first.message, first
    assert not store.gate.available
    rest = [await _insert(store, n) for n in range(1, CALLS)]
    assert all(exc is not None and "does not wait" in exc.message for exc in rest), rest
    state = store.gate.state()
    # each later call was refused by the gate, without a round trip to the server
    assert state["closed_by"] == "test insert" and state["skipped_calls"] == CALLS - 1
    assert "NetworkTimeout" in state["reason"]

    tcp.thaw()
    await eventually_async(lambda: store.gate.available, 15, "the probe to find MongoDB back")
    async with store.gate.guard("test insert", CALL_TIMEOUT_S):
        await store.db["gate_test"].insert_one({"n": "after"})
    assert store.gate.state()["probes"] >= 1


async def test_a_refused_connection_closes_the_gate_at_once(
        gated: tuple[TcpGate, MongoStore]) -> None:
    tcp, store = gated
    tcp.close()
    assert await _insert(store, 0) is not None
    assert not store.gate.available
    assert not await store.ping()  # health checks answer at once too
    tcp.open()
    await eventually_async(lambda: store.gate.available, 15, "the probe to find MongoDB back")


async def test_waiters_resume_when_the_probe_finds_mongodb_back(
        gated: tuple[TcpGate, MongoStore]) -> None:
    tcp, store = gated
    tcp.close()
    await _insert(store, 0)
    waiter = asyncio.create_task(store.gate.wait_available())
    await asyncio.sleep(0)  # one loop turn: the waiter runs into its wait, and stays there
    assert not waiter.done()
    tcp.open()
    await asyncio.wait_for(waiter, 15)


async def test_an_error_that_is_an_answer_leaves_the_gate_open(
        gated: tuple[TcpGate, MongoStore]) -> None:
    _, store = gated
    collection = store.db["gate_test"]
    await collection.insert_one({"_id": "taken"})
    with pytest.raises(Exception, match="duplicate key"):
        async with store.gate.guard("test insert", CALL_TIMEOUT_S):
            await collection.insert_one({"_id": "taken"})
    assert store.gate.available
