"""Batch work on a service's event loop lets the loop's other work (pushes, answers to
producers) run between chunks, and gives the same result as a plain map."""

from __future__ import annotations

import asyncio

from msgbus.tasks import COOPERATIVE_CHUNK, map_cooperatively


async def test_other_tasks_run_while_a_large_batch_is_mapped() -> None:
    seen_during: list[int] = []
    done = 0

    def work(n: int) -> int:
        nonlocal done
        done += 1
        return n * 2

    async def neighbour() -> None:
        while True:
            seen_during.append(done)
            await asyncio.sleep(0)

    task = asyncio.create_task(neighbour())
    await asyncio.sleep(0)
    items = list(range(10 * COOPERATIVE_CHUNK))
    result = await map_cooperatively(work, items)
    task.cancel()

    assert result == [n * 2 for n in items]
    # the neighbour ran between chunks, not only before and after the batch
    assert any(0 < d < len(items) for d in seen_during)


async def test_an_empty_batch_maps_to_nothing() -> None:
    assert await map_cooperatively(str, []) == []
