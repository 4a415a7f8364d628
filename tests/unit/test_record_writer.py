"""The receiver's record writer flushes each destination at its own rate, so one destination
held back by its limit never holds back the others, and a new rate applies at once."""

from __future__ import annotations

from pathlib import Path

from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.localqueue import LocalQueue
from receiver.recording import RecordWriter

QUEUE = "record"


async def test_a_slow_destination_does_not_hold_back_the_others(tmp_path: Path) -> None:
    buffer = LocalQueue(tmp_path, (QUEUE,), max_bytes=10**8)
    written: list[bytes] = []

    async def sink(values: list[bytes]) -> None:
        written.extend(values)

    rates = {"slow": 2.0, "fast": 0.0}
    writer = RecordWriter(buffer, QUEUE, sink, batch_size=50, global_rate=lambda: 0.0,
                          rate_of=lambda code: rates[code], idle_wait_s=0.05)
    await buffer.append([((QUEUE, "slow"), b"slow-%d" % i) for i in range(100)])
    await buffer.append([((QUEUE, "fast"), b"fast-%d" % i) for i in range(500)])
    writer.start()
    try:
        await eventually_async(lambda: sum(v.startswith(b"fast") for v in written) == 500, 15)
        assert sum(v.startswith(b"slow") for v in written) < 50  # still held to ~2/s
        slow_order = [v for v in written if v.startswith(b"slow")]
        assert slow_order == sorted(slow_order, key=lambda v: int(v.split(b"-")[1]))

        rates["slow"] = 0.0  # lifted at runtime: the backlog is flushed
        await eventually_async(lambda: len(written) == 600, 15)
        await eventually_async(lambda: buffer.depth(QUEUE) == 0, 15)
    finally:
        await writer.close()
        buffer.close()


async def test_the_global_rate_bounds_all_destinations_together(tmp_path: Path) -> None:
    buffer = LocalQueue(tmp_path, (QUEUE,), max_bytes=10**8)
    written: list[bytes] = []

    async def sink(values: list[bytes]) -> None:
        written.extend(values)

    global_rate = [5.0]
    writer = RecordWriter(buffer, QUEUE, sink, batch_size=50,
                          global_rate=lambda: global_rate[0], rate_of=lambda _: 0.0,
                          idle_wait_s=0.05)
    for code in ("a", "b", "c"):
        await buffer.append([((QUEUE, code), b"%s" % code.encode()) for _ in range(100)])
    writer.start()
    try:
        await eventually_async(lambda: len(written) >= 3, 15)
        assert len(written) < 100  # 300 waiting, ~5/s allowed
        global_rate[0] = 0.0
        await eventually_async(lambda: len(written) == 300, 15)
        assert {v for v in written} == {b"a", b"b", b"c"}
    finally:
        await writer.close()
        buffer.close()
