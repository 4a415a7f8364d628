from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from msgbus.drain import Drainer
from msgbus.errors import BufferFull
from msgbus.localqueue import LocalQueue


async def test_appends_are_fifo_per_queue_and_survive_reopen(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("a", "b"), max_bytes=10**8)
    await asyncio.gather(*(queue.append([("a", b"%d" % i), ("b", b"x")]) for i in range(100)))
    assert queue.depth("a") == 100 and queue.depth("b") == 100
    first = queue.read("a", 10)
    await queue.delete("a", [k for k, _ in first])
    queue.close()

    reopened = LocalQueue(tmp_path, ("a", "b"), max_bytes=10**8)
    values = [v for _, v in reopened.read("a", 1000)]
    assert len(values) == 90
    await reopened.append([("a", b"late")])
    assert reopened.read("a", 1000)[-1][1] == b"late"  # sequence continues after reopen
    reopened.close()


async def test_concurrent_appends_share_commits(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    commits = 0
    original = queue._commit

    def counting(groups: list[list[tuple[str, bytes]]]) -> None:
        nonlocal commits
        commits += 1
        original(groups)

    queue._commit = counting  # type: ignore[method-assign]
    await asyncio.gather(*(queue.append([("q", b"v")]) for _ in range(500)))
    assert queue.depth("q") == 500
    assert commits < 100  # group commit: far fewer fsyncs than appends
    queue.close()


async def test_full_buffer_refuses_appends_with_a_clear_error(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=64 * 1024)
    with pytest.raises(BufferFull, match="full"):
        for _ in range(1000):
            await queue.append([("q", b"x" * 4096)])
    depth = queue.depth("q")
    assert depth > 0
    queue.close()


async def test_drainer_retries_a_failing_sink_without_losing_entries(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    received: list[bytes] = []
    failures = 2

    async def flaky(entries: list[bytes]) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionError("sink down")
        received.extend(entries)

    drainer = Drainer(queue, "q", flaky, batch_size=7, idle_wait_s=0.05, max_backoff_s=0.2)
    drainer.start()
    await queue.append([("q", b"%d" % i) for i in range(50)])
    for _ in range(200):
        if len(received) == 50:
            break
        await asyncio.sleep(0.02)
    await drainer.close()
    assert received == [b"%d" % i for i in range(50)]
    assert queue.depth("q") == 0 and drainer.failures == 2
    queue.close()
