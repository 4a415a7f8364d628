"""A started service's full garbage collections walk only what it allocated after start."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from msgbus.gcfreeze import freeze_startup_objects
from msgbus.serving import ServerGroup
from msgbus_cli.stack import serve_until_signal


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # give the test process its collector back


def test_startup_objects_are_left_out_of_later_collections() -> None:
    startup_state = [{"n": n} for n in range(10_000)]  # e.g. imported modules, settings
    assert gc.is_tracked(startup_state)
    tracked_before = len(gc.get_objects())

    freeze_startup_objects()

    assert gc.get_freeze_count() >= len(startup_state)
    assert len(gc.get_objects()) < tracked_before - len(startup_state)
    created_later = [{"n": n} for n in range(10)]
    assert any(o is created_later for o in gc.get_objects())  # still collected normally


def test_startup_garbage_is_freed_before_freezing() -> None:
    """Frozen garbage would never be freed: what start-up dropped goes first."""
    first, second = Node(), Node()
    first.other, second.other = second, first  # a cycle only the collector frees
    dropped = weakref.ref(first)
    del first, second

    freeze_startup_objects()

    assert dropped() is None


async def test_serving_a_started_group_freezes_its_startup_objects() -> None:
    stop = asyncio.Event()
    stop.set()  # a signal right away: serve_until_signal returns after stopping the group
    await serve_until_signal(ServerGroup(), stop)
    assert gc.get_freeze_count() > 0


class SlowToFinalize:
    """Garbage whose finalizer lets other threads run while its collection is under way."""

    def __init__(self, finalizing: threading.Event, release: threading.Event) -> None:
        self.me, self.finalizing, self.release = self, finalizing, release

    def __del__(self) -> None:
        self.finalizing.set()
        self.release.wait(5)


def test_startup_garbage_is_freed_while_another_thread_is_collecting() -> None:
    release, finalizing = threading.Event(), threading.Event()

    def collect_slowly() -> None:
        SlowToFinalize(finalizing, release)
        gc.collect()  # runs the finalizer: blocked until released

    other = threading.Thread(target=collect_slowly)
    other.start()
    assert finalizing.wait(5)  # its collection is under way: in the finalizer
    threading.Timer(0.2, release.set).start()
    first, second = Node(), Node()
    first.other, second.other = second, first
    dropped = weakref.ref(first)
    del first, second

    freeze_startup_objects()

    other.join(5)
    assert dropped() is None, "frozen while another thread collected: never freed"
