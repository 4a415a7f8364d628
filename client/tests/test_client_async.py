"""AsyncMsgbusClient: same contract as the sync client, on asyncio."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from client_testkit import API_KEY, FAST, StubReceiver, eventually_async, free_port

from msgbus_client import AsyncMsgbusClient, ClientClosedError, InvalidMessageError


def make(url: str, spool_dir: Path, **options: Any) -> AsyncMsgbusClient:
    return AsyncMsgbusClient(url, API_KEY, spool_dir=spool_dir, **{**FAST, **options})


async def test_async_send_delivers_fields(receiver: StubReceiver, spool_dir: Path) -> None:
    async with make(receiver.url, spool_dir) as client:
        message_id = await client.send("orders", {"a": 1}, biz_id="b-1", headers={"h": "v"})
        blob_id = await client.send("files", b"\x00\x01", content_type="application/pdf")
        assert await asyncio.to_thread(client.spool.pending_count) == 0
    first, second = receiver.received
    assert first.doc == {
        "message_id": message_id,
        "biz_id": "b-1",
        "created_at": first.doc["created_at"],
        "headers": {"h": "v"},
        "body": {"a": 1},
    }
    assert second.doc["message_id"] == blob_id
    assert (second.doc["body_base64"], second.doc["content_type"]) == ("AAE=", "application/pdf")
    with pytest.raises(ClientClosedError):
        await client.send("orders", 1)


async def test_async_bad_input_raises_and_spools_nothing(
    receiver: StubReceiver, spool_dir: Path
) -> None:
    async with make(receiver.url, spool_dir) as client:
        with pytest.raises(InvalidMessageError):
            await client.send("orders", object())
        assert client.spool.pending_count() == 0
    assert receiver.attempts == []


async def test_async_group_commit_many_concurrent_senders(
    receiver: StubReceiver, spool_dir: Path
) -> None:
    async with make(receiver.url, spool_dir, group_commit_ms=2) as client:
        ids = await asyncio.gather(*(client.send("orders", {"n": n}) for n in range(200)))
        assert len(set(ids)) == 200
        stats = await asyncio.to_thread(client.spool.stats)
        assert stats.commits < 200  # the senders shared commits
        await eventually_async(lambda: sorted(receiver.ids()) == sorted(ids))
        await eventually_async(lambda: client.spool.pending_count() == 0)
    assert any(a.endpoint == "batch" for a in receiver.attempts)


async def test_async_receiver_down_then_up(spool_dir: Path) -> None:
    down = StubReceiver(port=free_port())
    client = make(down.url, spool_dir)
    try:
        ids = [await client.send("orders", n) for n in range(5)]
        assert await asyncio.to_thread(client.spool.pending_count) == 5
        await asyncio.to_thread(down.start)
        await eventually_async(lambda: sorted(down.ids()) == ids)
        assert await client.close(timeout_s=5) == 0
    finally:
        await client.close(timeout_s=0)
        await asyncio.to_thread(down.stop)


async def test_async_start_picks_up_leftovers_and_rejections(
    receiver: StubReceiver, spool_dir: Path
) -> None:
    dead = make(f"http://127.0.0.1:{free_port()}", spool_dir)
    left_id = await dead.send("orders", {"left": True})
    assert await dead.close(timeout_s=0) == 1

    receiver.set_rule(lambda dest, doc: (422, {"error": "bad"}) if doc["body"] == -1 else None)
    async with make(receiver.url, spool_dir) as client:
        await eventually_async(lambda: receiver.ids() == [left_id])
        bad = await client.send("orders", -1)
        await eventually_async(lambda: client.spool.rejected_count() == 1)
        [rejected] = await client.list_rejected()
        assert (rejected.message_id, rejected.status, rejected.error) == (
            bad,
            422,
            {"error": "bad"},
        )
        receiver.set_rule(None)
        assert await client.resend_rejected(bad)
        await eventually_async(lambda: receiver.ids() == [left_id, bad])
        assert await client.purge_rejected() == 0


async def test_async_close_without_start_flushes_leftovers(
    receiver: StubReceiver, spool_dir: Path
) -> None:
    dead = make(f"http://127.0.0.1:{free_port()}", spool_dir)
    message_id = await dead.send("orders", 1)
    await dead.close(timeout_s=0)
    never_started = make(receiver.url, spool_dir)
    assert await never_started.close(timeout_s=5) == 0
    assert receiver.ids() == [message_id]
