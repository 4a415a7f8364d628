"""Processes sharing one subscription's concurrency cap through MongoDB: the pushes in flight
of all of them together never exceed the cap, the cap gets used, and a process that dies
without a word gives its share back when its lease ends. (The same with dispatchers and
compensators as OS processes and a real subscriber: test_replicas.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.delivery.shares import CapShares
from msgbus.store import MongoStore
from msgbus.store.shares import ShareStore

pytestmark = pytest.mark.serial  # heartbeats and leases on time: run alone (scripts/test.sh)

SUB = "orders/billing"
CAP = 6
PUSH_S = 0.02  # what one push takes
# a quarter of the product's defaults (1 s, 5 s): a busy CI machine's MongoDB stand-in has taken
# over a second for one heartbeat, which with a 1 s lease made every process fall back to one slot
HEARTBEAT_S, LEASE_S = 0.25, 2.5


@dataclass
class InFlight:
    now: int = 0
    peak: int = 0
    done: int = 0
    over_cap: list[int] = field(default_factory=list)


async def _push_forever(shares: CapShares, counter: InFlight) -> None:
    slots = shares.slots(SUB, CAP)
    while True:
        await slots.acquire()
        counter.now += 1
        counter.peak = max(counter.peak, counter.now)
        if counter.now > CAP:
            counter.over_cap.append(counter.now)
        try:
            await asyncio.sleep(PUSH_S)
        finally:
            counter.now -= 1
            counter.done += 1
            slots.release()


async def test_processes_never_exceed_the_cap_together_and_a_dead_ones_share_returns(
        store: MongoStore) -> None:
    counter = InFlight()
    processes = [CapShares(ShareStore(store), instance=f"p{i}", component="dispatcher",
                           heartbeat_s=HEARTBEAT_S, lease_s=LEASE_S) for i in range(3)]
    pushers: dict[str, list[asyncio.Task[None]]] = {}
    for process in processes:
        process.start()
        pushers[process.instance] = [asyncio.create_task(_push_forever(process, counter))
                                     for _ in range(CAP)]  # each would take the whole cap
    survivors, dead = processes[:2], processes[2]
    try:
        await eventually_async(lambda: counter.peak == CAP, 30, "the whole cap in use")
        await eventually_async(lambda: all(p.slots(SUB, CAP).limit > 0 for p in processes), 30,
                               "a share for every process")
        # kill -9: its pushes and heartbeats stop, and it never says goodbye
        for task in [*pushers.pop(dead.instance), *dead._tasks]:
            task.cancel()
        await eventually_async(
            lambda: sum(p.slots(SUB, CAP).limit for p in survivors) == CAP,
            10 * LEASE_S, "the dead process's share back with the others")
        done_before = counter.done
        await eventually_async(lambda: counter.done > done_before + 10 * CAP, 30, "pushes go on")
        assert counter.over_cap == []
    finally:
        for task in (t for ts in pushers.values() for t in ts):
            task.cancel()
        for process in survivors:
            await process.close()
        with contextlib.suppress(BaseException):
            await dead.close()


async def test_a_process_restarted_under_its_name_lets_go_of_what_its_former_run_held(
        store: MongoStore) -> None:
    """A dispatcher killed and restarted in its pod within its lease keeps its instance name,
    and its lease goes on. Its former run's entry of a subscription that it no longer serves
    (the assignment moved it meanwhile) would count as held by a live instance and keep that
    room from the others for good: the new run drops it at its first beat."""
    shares = ShareStore(store)
    counter = InFlight()

    def process(name: str) -> CapShares:
        return CapShares(shares, instance=name, component="dispatcher",
                         heartbeat_s=HEARTBEAT_S, lease_s=LEASE_S)

    first_run, other = process("restarted"), process("other")
    first_run.start()
    killed = [asyncio.create_task(_push_forever(first_run, counter)) for _ in range(CAP)]
    pushing: list[asyncio.Task[None]] = []
    second_run = process("restarted")  # serves other subscriptions now
    former_entry_gone = _entry_gone(shares, "dispatcher:restarted")
    try:
        await eventually_async(lambda: first_run.slots(SUB, CAP).limit == CAP, 30,
                               "the whole cap with the first run")
        for task in [*killed, *first_run._tasks]:  # kill -9
            task.cancel()
        second_run.start()
        other.start()
        pushing = [asyncio.create_task(_push_forever(other, counter)) for _ in range(CAP)]
        await eventually_async(former_entry_gone, 30, "the former run's entry gone")
        await eventually_async(lambda: other.slots(SUB, CAP).limit == CAP, 30,
                               "the whole cap with the other process")
        assert counter.over_cap == []
    finally:
        for task in pushing:
            task.cancel()
        await other.close()
        await second_run.close()


def _entry_gone(shares: ShareStore, instance: str) -> Callable[[], Awaitable[bool]]:
    async def gone() -> bool:
        doc = (await shares.read([SUB])).get(SUB) or {}
        return all(e["instance"] != instance for e in doc.get("entries", []))
    return gone
