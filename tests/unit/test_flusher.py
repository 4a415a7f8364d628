"""`Flusher`: a batch the sink cannot take in time (a loaded MongoDB times out on it) is split
until it goes through; nothing is lost or reordered, and batches grow back afterwards."""

from __future__ import annotations

from pathlib import Path

from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.flush import Flusher
from msgbus.localqueue import LocalQueue


async def test_a_batch_too_big_for_the_sink_is_split_until_everything_moved(
        tmp_path: Path) -> None:
    queue = LocalQueue(tmp_path, ("q",), max_bytes=10**8)
    taken: list[bytes] = []
    sizes: list[int] = []
    too_big = 100  # a server that takes 100 entries in time, never 1,000

    async def sink(entries: list[bytes]) -> None:
        sizes.append(len(entries))
        if len(entries) > too_big:
            raise TimeoutError(f"{len(entries)} entries took longer than the timeout")
        taken.extend(entries)

    flusher = Flusher(queue, "q", sink, batch_size=1000, idle_wait_s=0.05, max_backoff_s=0.05)
    await queue.append([("q", b"%05d" % i) for i in range(2500)])
    flusher.start()
    await eventually_async(lambda: queue.depth("q") == 0, 20,
                           "the queue to be flushed in smaller batches", interval_s=0.01)
    await flusher.close()
    queue.close()

    assert taken == [b"%05d" % i for i in range(2500)]  # each once, in order
    # 1,000 .. 125 failed, 62 went through: 41 batches of 62, one bigger one tried after 32
    assert sizes[:5] == [1000, 500, 250, 125, 62]
    assert flusher.failures == 5
    assert flusher.batch_now == 62
