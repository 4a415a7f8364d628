from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from pathlib import Path

import pytest
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.errors import BufferFull
from msgbus.flush import Flusher
from msgbus.localqueue import Item, LocalQueue


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

    def counting(groups: list[list[Item]]) -> list[list[bool]]:
        nonlocal commits
        commits += 1
        return original(groups)

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


async def test_flusher_retries_a_failing_sink_without_losing_entries(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    received: list[bytes] = []
    failures = 2

    async def flaky(entries: list[bytes]) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionError("sink down")
        received.extend(entries)

    flusher = Flusher(queue, "q", flaky, batch_size=7, idle_wait_s=0.05, max_backoff_s=0.2)
    flusher.start()
    await queue.append([("q", b"%d" % i) for i in range(50)])
    # flushed: handed to the sink, then removed from the queue (a moment later)
    await eventually_async(lambda: len(received) == 50 and queue.depth("q") == 0, 10,
                           "the queue to be flushed", interval_s=0.01)
    await flusher.close()
    assert received == [b"%d" % i for i in range(50)]
    assert flusher.failures == 2
    queue.close()


async def test_append_new_skips_keys_seen_within_the_window(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8, dedupe_window_s=3600)
    first = await queue.append_new([(b"id-1", [("q", b"one")]), (b"id-2", [("q", b"two")]),
                                    (b"id-1", [("q", b"one again, same request")])])
    assert first == [True, True, False]
    # concurrent appends of the same key: exactly one wins
    racing = await asyncio.gather(*(queue.append_new([(b"id-3", [("q", b"three")])])
                                    for _ in range(20)))
    assert sorted(r[0] for r in racing) == [False] * 19 + [True]
    queue.close()

    reopened = LocalQueue(tmp_path, ("q",), max_bytes=10**8, dedupe_window_s=3600)
    assert await reopened.append_new([(b"id-2", [("q", b"x")]), (None, [("q", b"keyless")])]) \
        == [False, True]
    assert [v for _, v in reopened.read("q", 10)] == [b"one", b"two", b"three", b"keyless"]
    reopened.close()


async def test_keys_are_forgotten_after_the_window(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8, dedupe_window_s=0.05)
    assert await queue.append_new([(b"id-1", [("q", b"one")])]) == [True]
    await asyncio.sleep(0.1)  # the window passing is the scenario: nothing to poll
    await queue.append_new([(b"other", [("q", b"prunes the expired key")])])
    assert await queue.append_new([(b"id-1", [("q", b"one, much later")])]) == [True]
    queue.close()


async def test_keys_need_a_dedupe_window(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    with pytest.raises(ValueError, match="dedupe_window_s"):
        await queue.append_new([(b"id", [("q", b"v")])])
    queue.close()


async def test_partitions_are_fifo_of_their_own_and_survive_reopen(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("records",), max_bytes=10**8)
    # "a" and "a-b" share a prefix: their keys must never interleave
    for i in range(5):
        await queue.append([(("records", "a-b"), b"ab%d" % i), (("records", "a"), b"a%d" % i)])
    assert queue.partitions("records") == ["a", "a-b"]
    assert [v for _, v in queue.read("records", 10, partition="a")] == [
        b"a0", b"a1", b"a2", b"a3", b"a4"]
    first_two = queue.read("records", 2, partition="a-b")
    await queue.delete("records", [k for k, _ in first_two])
    queue.close()

    reopened = LocalQueue(tmp_path, ("records",), max_bytes=10**8)
    await reopened.append([(("records", "a"), b"a5"), (("records", "z"), b"z0")])
    assert reopened.read("records", 10, partition="a")[-1][1] == b"a5"  # continues in order
    assert [v for _, v in reopened.read("records", 10, partition="a-b")] == [b"ab2", b"ab3",
                                                                             b"ab4"]
    assert reopened.partitions("records") == ["a", "a-b", "z"]
    assert reopened.depth("records") == 6 + 3 + 1
    reopened.close()


def _flush_in_another_process(path: str) -> int:
    """Runs in a child process: delete every entry of queue "q"; returns how many."""
    queue = LocalQueue(Path(path), ("q",), max_bytes=10**8)
    try:
        entries = queue.read("q", 10_000)
        asyncio.run(queue.delete("q", [key for key, _ in entries]))
        return len(entries)
    finally:
        queue.close()


async def test_one_process_appends_and_rings_while_another_flushes(tmp_path: Path) -> None:
    """The receiver/flush-process split: the appender's on_commit hook runs once per durable
    commit, and a full buffer accepts again once another process flushed it."""
    rung = 0

    def ring() -> None:
        nonlocal rung
        rung += 1

    queue = LocalQueue(tmp_path, ("q",), max_bytes=64 * 1024, on_commit=ring)
    while True:  # fill it up
        try:
            await queue.append([("q", b"x" * 4096)])
        except BufferFull:
            break
    assert rung == queue.depth("q") > 0  # one ring per commit, after the commit
    with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")) as other:
        flushed = await asyncio.get_running_loop().run_in_executor(
            other, _flush_in_another_process, str(tmp_path))
    assert flushed == rung and queue.depth("q") == 0
    await queue.append([("q", b"accepted again")])  # no stale "full"
    queue.close()


async def test_notify_appended_wakes_a_waiting_flusher(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    waiting = asyncio.create_task(queue.wait_for_entries("q", timeout_s=30))
    # it waits (asyncio.Event's own list of waiters; Python 3.11's wait_for starts the wait
    # in a task of its own, one loop turn later)
    await eventually_async(lambda: queue._appended["q"]._waiters, 5, "the wait for entries",
                           interval_s=0)
    queue.notify_appended()  # what the flush process does when the receiver rings
    await asyncio.wait_for(waiting, 5)
    queue.close()
