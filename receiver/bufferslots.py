"""Buffer slots: several processes share one buffer root, each owning one `slot-N` dir.

    <root>/slot-0/slot.lock   flock()ed by the owner, which writes "pid=... host=..." into it
    <root>/slot-0/data.mdb    the owner's LMDB environment (msgbus.localqueue)
    <root>/slot-1/...

A process owns a slot while it holds an exclusive flock on the slot's lock file; the kernel drops
the lock when the process exits, even on kill -9. A slot nobody holds that still has an LMDB
environment is an orphan: `find_orphans` lists them, another process claims one with
`claim_path` and flushes it (receiver/adoption.py), then `ClaimedSlot.remove()`s it.
flock() needs a local filesystem (not NFS). Taking, reading and dropping the lock file is the
client library's code (`msgbus_client.lockfile`, which a client spool's lock uses too): the
receiver imports it, besides the core; the client imports nothing of the repository.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from msgbus_client.lockfile import LockFileReplaced, lock_holder, take_lock

from msgbus.errors import Unavailable

SLOT_PREFIX = "slot-"
LOCK_FILE = "slot.lock"
LMDB_DATA_FILE = "data.mdb"
DEFAULT_MAX_SLOTS = 64
# A removed slot is first renamed to this prefix (atomically), so that a process claiming the
# slot's name meanwhile gets a fresh dir instead of one being deleted under it.
_REMOVING_PREFIX = ".removing-"


class ClaimedSlot:
    """A slot this process owns until `release()` (or `remove()`)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        """The locked file's descriptor: a child process given it holds the lock too (an flock
        belongs to the open file, shared by every process that has a descriptor of it)."""
        if self._fd is None:
            raise RuntimeError(f"slot {self.path} is not held")
        return self._fd

    def release(self) -> None:
        """Drop the lock; the dir and its data stay for the next owner."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no owner name; also marks the slot's last use (mtime)
        os.close(fd)

    def remove(self) -> None:
        """Delete the slot dir and everything in it, then drop the lock."""
        if self._fd is None:
            raise RuntimeError(f"slot {self.path} is not held")
        doomed = self.root / f"{_REMOVING_PREFIX}{self.path.name}-{uuid.uuid4().hex[:8]}"
        os.rename(self.path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        self.release()

    def __repr__(self) -> str:
        return f"ClaimedSlot({str(self.path)!r}, held={self.held})"


def claim_slot(root: Path, max_slots: int = DEFAULT_MAX_SLOTS) -> ClaimedSlot:
    """Claim the first slot under `root` no live process holds (creating it if needed).

    A process restarted in place takes the lowest free slot, so it usually gets its own old one
    back with whatever was left in it. Raises `Unavailable` when all `max_slots` are held.
    """
    root.mkdir(parents=True, exist_ok=True)
    for n in range(max_slots):
        claimed = claim_path(root / f"{SLOT_PREFIX}{n}")
        if claimed is not None:
            return claimed
    raise Unavailable(f"all {max_slots} buffer slots under {root} are held by live processes")


def claim_path(slot: Path) -> ClaimedSlot | None:
    """Claim this one slot (creating it if needed); None when a live process holds it."""
    try:
        taken = take_lock(slot / LOCK_FILE)
    except LockFileReplaced:  # adopters kept removing the slot while we waited
        raise Unavailable(f"buffer slot {slot} keeps being replaced; try again") from None
    return None if isinstance(taken, str) else ClaimedSlot(slot, taken)


def holder_of(slot: Path) -> str | None:
    """Who holds `slot` ("pid=... host=..."), or None when no live process does: a probe that
    never takes a slot away from anyone (a claim that meets it retries briefly)."""
    return lock_holder(slot / LOCK_FILE)


def slots(root: Path) -> list[Path]:
    """The slot dirs under `root`, by slot number."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if p.is_dir() and p.name.startswith(SLOT_PREFIX)
             and p.name[len(SLOT_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(SLOT_PREFIX):]))


def idle_s(slot: Path, now: float | None = None) -> float:
    """Seconds since the slot's LMDB data or lock file last changed."""
    stamps = []
    for name in (LMDB_DATA_FILE, LOCK_FILE):
        with contextlib.suppress(FileNotFoundError):
            stamps.append((slot / name).stat().st_mtime)
    if not stamps:
        return 0.0
    return max(0.0, (time.time() if now is None else now) - max(stamps))


def find_orphans(root: Path, min_idle_s: float) -> list[Path]:
    """Slots under `root` that hold an LMDB environment, that no live process holds, and that
    nobody touched for `min_idle_s` (giving a restarting owner the time to take its slot back)."""
    return [slot for slot in slots(root)
            if (slot / LMDB_DATA_FILE).is_file() and holder_of(slot) is None
            and idle_s(slot) >= min_idle_s]


def sweep_removed(root: Path) -> int:
    """Finish removals that a process died in the middle of; returns how many it finished."""
    finished = 0
    leftovers = root.iterdir() if root.is_dir() else iter(())
    for leftover in leftovers:
        if leftover.is_dir() and leftover.name.startswith(_REMOVING_PREFIX):
            with _locked_if_free(leftover / LOCK_FILE) as free:
                if free:  # else its remover is still at work
                    shutil.rmtree(leftover, ignore_errors=True)
                    finished += 1
    return finished


@contextlib.contextmanager
def _locked_if_free(lock_path: Path) -> Iterator[bool]:
    """Holds `lock_path` exclusively if it exists and nobody holds it; yields whether it is free
    (a missing lock file counts as free). Never creates the file."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
