"""How processes split a subscription's concurrency cap: the fair shares, the decision of one
process, and the slots whose size changes under load."""

from __future__ import annotations

import asyncio

import pytest

from msgbus.delivery.shares import decide, demand_changed, fair_shares, rotation
from msgbus.delivery.slots import AdjustableSlots, RateSlots


def test_the_cap_is_split_evenly_between_processes_that_want_all_of_it() -> None:
    assert fair_shares(12, {"a": 12, "b": 12, "c": 12}, ["a", "b", "c"]) == {
        "a": 4, "b": 4, "c": 4}


def test_what_one_process_does_not_need_goes_to_the_others() -> None:
    assert fair_shares(10, {"a": 1, "b": 10, "c": 10}, ["a", "b", "c"]) == {
        "a": 1, "b": 5, "c": 4}
    assert fair_shares(10, {"idle": 0, "busy": 10}, ["idle", "busy"]) == {"idle": 0, "busy": 10}


def test_what_nobody_asks_for_is_dealt_round_so_an_idle_process_can_push_at_once() -> None:
    assert fair_shares(8, {"idle": 0, "busy": 2}, ["idle", "busy"]) == {"idle": 3, "busy": 5}
    assert fair_shares(3, {"a": 0, "b": 0, "c": 0, "d": 0}, ["a", "b", "c", "d"]) == {
        "a": 1, "b": 1, "c": 1, "d": 0}


def test_a_cap_smaller_than_the_processes_goes_round_in_turn() -> None:
    demands = {"a": 5, "b": 5, "c": 5}
    holders = set()
    for now_s in (0.0, 10.0, 20.0):
        shares = fair_shares(2, demands, rotation(demands, now_s))
        assert sum(shares.values()) == 2
        holders |= {name for name, share in shares.items() if share}
    assert holders == {"a", "b", "c"}  # nobody starves


def test_a_larger_share_is_taken_only_from_the_room_the_others_leave() -> None:
    assert decide(cap=8, fair=4, others_held=6, in_use=0).limit == 2
    assert decide(cap=8, fair=4, others_held=2, in_use=0).limit == 4
    shrinking = decide(cap=8, fair=2, others_held=0, in_use=6)
    assert shrinking.limit == 2 and shrinking.held == 6  # recorded until the pushes end


def test_demand_is_written_on_a_real_change_only() -> None:
    assert demand_changed(0, 1) and demand_changed(3, 0)
    assert not demand_changed(16, 18) and demand_changed(16, 20)


async def test_slots_shrink_as_pushes_end_and_grow_at_once() -> None:
    slots = AdjustableSlots(3)
    for _ in range(3):
        await slots.acquire()
    slots.set_limit(1)
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    slots.release()
    slots.release()
    await asyncio.sleep(0)
    assert not waiter.done() and slots.in_use == 1  # still over the new limit of 1
    slots.release()
    await asyncio.wait_for(waiter, 1)
    assert slots.in_use == 1
    slots.set_limit(3)
    await asyncio.wait_for(slots.acquire(), 1)
    assert slots.in_use == 2


async def test_a_cancelled_wait_takes_no_slot() -> None:
    asked: list[int] = []
    slots = AdjustableSlots(0, on_wait=lambda: asked.append(1))
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    assert asked == [1] and slots.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    slots.set_limit(1)
    assert slots.in_use == 0 and slots.waiting == 0


async def test_rate_slots_let_no_more_than_the_limit_begin_within_a_window() -> None:
    rate = RateSlots(3, window_s=0.2)
    for _ in range(3):
        await rate.acquire()
    fourth = asyncio.ensure_future(rate.acquire())
    await asyncio.sleep(0)
    assert not fourth.done() and rate.in_use == 3 and rate.waiting == 1
    await asyncio.wait_for(fourth, 2)  # once the first has left the window
    assert rate.in_use <= 3


async def test_a_wait_cancelled_as_slots_free_up_neither_fails_nor_takes_one() -> None:
    slots = AdjustableSlots(0)
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    slots.set_limit(1)  # drops the cancelled wait before its task has run again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.in_use == 0
    await asyncio.wait_for(slots.acquire(), 1)
