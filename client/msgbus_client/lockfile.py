"""Exclusive ownership of a spool dir by one process: an flock()ed lock file.

The kernel releases the lock when the owner exits, even on kill -9, so a new process can take
over a dir left behind. flock() needs a local filesystem (not NFS).

The owner writes "pid=... host=..." into the lock file, so `is_held()` (used by the spool tools
and the node rescuer DaemonSet) can say who holds a spool without owning it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from msgbus_client.errors import SpoolLockedError

LOCK_FILE_NAME = "spool.lock"

# A lock held by someone who has not written a name (yet) is an is_held() probe or an owner in
# the microseconds between flock() and writing its name: wait a little before giving up.
_UNNAMED_RETRIES = 5
_UNNAMED_RETRY_S = 0.01
_MAX_ATTEMPTS = 100  # lock files replaced under us (a rescued spool removed) before giving up


class LockFileReplaced(Exception):
    """The lock file kept being removed and re-created while this process tried to lock it."""


def take_lock(lock_path: Path) -> int | str:
    """Lock `lock_path` (creating it, and its dir) for this process and write this process's
    name into it: returns the locked descriptor; or, when a live process holds it, that
    holder's name ("" when it has not written one). Closing the descriptor drops the lock.

    Whoever removes the dir (a rescue, an adopter) does so holding the lock; a process that
    opened the old lock file meanwhile must not keep a lock on a file that is no longer there,
    so it tries again (`LockFileReplaced` after many times).
    """
    unnamed = 0
    for _ in range(_MAX_ATTEMPTS):
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the dir does not exist (yet, or any more)
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner_text(fd)
            os.close(fd)
            if not owner and unnamed < _UNNAMED_RETRIES:
                unnamed += 1
                time.sleep(_UNNAMED_RETRY_S)
                continue
            return owner
        except BaseException:
            os.close(fd)
            raise
        if _is_current(fd, lock_path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{owner_name()}\n".encode(), 0)
            return fd
        os.close(fd)
    raise LockFileReplaced(f"{lock_path} keeps being replaced; try again")


class SpoolDirLock:
    """Holds an exclusive, non-blocking flock on `<spool_dir>/spool.lock` until release()."""

    def __init__(self, spool_dir: Path) -> None:
        self.path = spool_dir / LOCK_FILE_NAME
        try:
            taken = take_lock(self.path)
        except LockFileReplaced:
            raise SpoolLockedError(f"spool dir {spool_dir} keeps being replaced; try again"
                                   ) from None
        if isinstance(taken, str):
            raise SpoolLockedError(
                f"spool dir {spool_dir} is already in use by {_describe(taken)}. One process "
                "owns a spool dir at a time: give every process (and every client in a "
                "process) its own spool_dir, e.g. one per pod or per worker process, or use "
                "Spool.open_slot().")
        self._fd: int | None = taken

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the only descriptor drops the flock


def owner_name() -> str:
    """How this process names itself in the lock files it holds."""
    return f"pid={os.getpid()} host={socket.gethostname()}"


def is_held(spool_dir: Path) -> str | None:
    """Who holds `spool_dir` ("pid=... host=..."), or None when no live process does."""
    return lock_holder(spool_dir / LOCK_FILE_NAME)


def lock_holder(lock_path: Path) -> str | None:
    """Who holds the lock file `lock_path` ("pid=... host=..."), or None when no live process
    does (also used for the receiver's buffer slots, which are locked the same way).

    A non-owning probe: it opens an existing lock file read-only (it never creates one) and takes
    a shared flock for an instant. While it holds that (a few microseconds), an owner starting on
    the dir would see it busy; owners wait a little for an unnamed lock, so that is harmless. The
    answer is a snapshot: an owner may start or exit right after it.
    """
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _owner_text(fd) or "an unnamed process (it is just starting)"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _is_current(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path` (not unlinked or replaced)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def _owner_text(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def _describe(owner: str) -> str:
    return f"another owner ({owner})" if owner else "another owner"
