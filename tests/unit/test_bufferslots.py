"""Buffer slots: one owner per slot, orphans found after their owner died, live owners never
disturbed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from msgbus.errors import Unavailable
from receiver.bufferslots import (
    LMDB_DATA_FILE,
    claim_path,
    claim_slot,
    find_orphans,
    holder_of,
    slots,
    sweep_removed,
)

REPO = Path(__file__).resolve().parents[2]

# Claims a slot, writes its LMDB data file, says "held", then waits to be killed.
_HOLDER = """
import sys, time
from pathlib import Path
from receiver.bufferslots import LMDB_DATA_FILE, claim_slot
slot = claim_slot(Path(sys.argv[1]))
(slot.path / LMDB_DATA_FILE).write_bytes(b"entries")
print(slot.path.name, flush=True)
time.sleep(600)
"""


HolderFactory = Callable[[], tuple[subprocess.Popen[str], Path]]


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[HolderFactory]:
    """Starts processes holding a slot under tmp_path/root: each call -> (process, slot)."""
    started: list[subprocess.Popen[str]] = []

    def start() -> tuple[subprocess.Popen[str], Path]:
        root = tmp_path / "root"
        process = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root)], cwd=REPO,
                                   stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout is not None
        name = process.stdout.readline().strip()
        assert name, "the holder process did not claim a slot"
        return process, root / name

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_each_claim_gets_a_slot_of_its_own(tmp_path: Path) -> None:
    first, second = claim_slot(tmp_path), claim_slot(tmp_path)
    assert first.path != second.path
    assert [p.name for p in slots(tmp_path)] == ["slot-0", "slot-1"]
    assert claim_path(first.path) is None  # held: nobody else gets it
    first.release()
    again = claim_slot(tmp_path)
    assert again.path == first.path  # the lowest free slot comes back, with its data
    again.release()
    second.release()


def test_claims_stop_at_max_slots(tmp_path: Path) -> None:
    held = [claim_slot(tmp_path, max_slots=2) for _ in range(2)]
    with pytest.raises(Unavailable, match="all 2 buffer slots"):
        claim_slot(tmp_path, max_slots=2)
    for slot in held:
        slot.release()


def test_a_killed_holders_slot_is_reported_orphaned(holder: HolderFactory) -> None:
    process, slot = holder()
    assert holder_of(slot) == f"pid={process.pid} host={os.uname().nodename}"
    assert find_orphans(slot.parent, min_idle_s=0) == []
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    assert holder_of(slot) is None
    assert find_orphans(slot.parent, min_idle_s=0) == [slot]
    assert find_orphans(slot.parent, min_idle_s=3600) == []  # not idle long enough yet


def test_a_live_holders_slot_is_never_reported_nor_taken(holder: HolderFactory) -> None:
    process, slot = holder()
    for _ in range(50):
        assert find_orphans(slot.parent, min_idle_s=0) == []
    assert claim_path(slot) is None
    mine = claim_slot(slot.parent)
    assert mine.path != slot
    mine.release()
    assert process.poll() is None


def test_a_slot_without_lmdb_data_is_no_orphan(tmp_path: Path) -> None:
    claim_slot(tmp_path).release()
    assert find_orphans(tmp_path, min_idle_s=0) == []


def test_probes_never_turn_a_claim_away(tmp_path: Path) -> None:
    slot = claim_slot(tmp_path)
    (slot.path / LMDB_DATA_FILE).write_bytes(b"x")
    slot.release()
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            holder_of(slot.path)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for _ in range(300):
            claimed = claim_slot(tmp_path)
            assert claimed.path == slot.path
            claimed.release()
    finally:
        stop.set()
        prober.join()


def test_remove_deletes_the_slot_and_a_new_claim_starts_fresh(tmp_path: Path) -> None:
    slot = claim_slot(tmp_path)
    (slot.path / LMDB_DATA_FILE).write_bytes(b"x")
    slot.remove()
    assert not slot.held
    assert list(tmp_path.iterdir()) == []
    fresh = claim_slot(tmp_path)
    assert fresh.path == slot.path and not (fresh.path / LMDB_DATA_FILE).exists()
    fresh.release()


def test_sweep_finishes_a_removal_its_remover_died_in(tmp_path: Path) -> None:
    leftover = tmp_path / ".removing-slot-3-abcd"
    leftover.mkdir()
    (leftover / LMDB_DATA_FILE).write_bytes(b"x")
    busy = claim_path(tmp_path / ".removing-slot-4-ef01")  # a remover still at work
    assert busy is not None
    assert sweep_removed(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".removing-slot-4-ef01"]
    busy.release()
