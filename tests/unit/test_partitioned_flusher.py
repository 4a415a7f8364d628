"""`PartitionedFlusher`: one partition whose sink is stuck or failing never holds back the
others, and nothing is lost or reordered within a partition."""

from __future__ import annotations

import asyncio
from pathlib import Path

from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.flush import PartitionedFlusher
from msgbus.localqueue import LocalQueue, Target


async def test_a_stuck_partition_does_not_hold_back_the_others(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    released = asyncio.Event()
    received: dict[str, list[bytes]] = {"stuck": [], "free": []}

    async def sink(entries: list[bytes]) -> None:
        partition = entries[0].split(b":")[0].decode()
        assert all(e.startswith(partition.encode()) for e in entries)  # one partition a batch
        if partition == "stuck":
            await released.wait()  # a broker that does not answer
        received[partition].extend(entries)

    flusher = PartitionedFlusher(queue, "q", sink, batch_size=5, idle_wait_s=0.05)
    flusher.start()
    await queue.append([(("q", "stuck"), b"stuck:%d" % i) for i in range(12)])
    await queue.append([(("q", "free"), b"free:%d" % i) for i in range(30)])
    # flushed: handed to the sink, then removed from the queue and no longer busy
    await eventually_async(lambda: len(received["free"]) == 30 and flusher.busy_partitions() == [
        "stuck"], 10, "the free partition to be flushed", interval_s=0.01)
    assert received["stuck"] == []

    released.set()
    await eventually_async(lambda: len(received["stuck"]) == 12 and queue.depth("q") == 0, 10,
                           "the stuck partition to be flushed", interval_s=0.01)
    await flusher.close()
    assert received["stuck"] == [b"stuck:%d" % i for i in range(12)]
    assert received["free"] == [b"free:%d" % i for i in range(30)]
    queue.close()


async def test_a_failing_partition_is_retried_while_the_others_move(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    failures = 3
    received: list[bytes] = []

    async def sink(entries: list[bytes]) -> None:
        nonlocal failures
        if entries[0].startswith(b"bad") and failures:
            failures -= 1
            raise ConnectionError("broker down")
        received.extend(entries)

    flusher = PartitionedFlusher(queue, "q", sink, batch_size=4, idle_wait_s=0.05,
                                 max_backoff_s=0.2)
    flusher.start()
    entries: list[tuple[Target, bytes]] = [(("q", p), b"%s:%d" % (p.encode(), i))
                                           for i in range(10) for p in ("bad", "good")]
    await queue.append(entries)
    # flushed: handed to the sink, then removed from the queue (a moment later)
    await eventually_async(lambda: len(received) == 20 and queue.depth("q") == 0, 10,
                           "both partitions to be flushed", interval_s=0.01)
    await flusher.close()
    assert [e for e in received if e.startswith(b"bad")] == [b"bad:%d" % i for i in range(10)]
    assert flusher.failures == 3
    queue.close()


async def test_flush_once_moves_a_batch_of_every_partition(tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    batches: list[list[bytes]] = []

    async def sink(entries: list[bytes]) -> None:
        batches.append(entries)

    flusher = PartitionedFlusher(queue, "q", sink, batch_size=3)
    await queue.append([(("q", p), b"%s%d" % (p.encode(), i)) for p in "ab" for i in range(4)])
    assert await flusher.flush_once() == 6
    assert batches == [[b"a0", b"a1", b"a2"], [b"b0", b"b1", b"b2"]]
    assert queue.depth("q") == 2
    queue.close()
