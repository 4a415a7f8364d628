"""Exclusive ownership of a spool dir by one process: an flock()ed lock file.

The kernel releases the lock when the owner exits, even on kill -9, so a new process can take
over a dir left behind. flock() needs a local filesystem (not NFS).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path

from msgbus_client.errors import SpoolLockedError

LOCK_FILE_NAME = "spool.lock"


class SpoolDirLock:
    """Holds an exclusive, non-blocking flock on `<spool_dir>/spool.lock` until release()."""

    def __init__(self, spool_dir: Path) -> None:
        self.path = spool_dir / LOCK_FILE_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise SpoolLockedError(
                f"spool dir {spool_dir} is already in use by {owner}. One process owns a spool "
                "dir at a time: give every process (and every client in a process) its own "
                "spool_dir, e.g. one per pod or per worker process."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the only descriptor drops the flock


def _read_owner(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f"another owner ({text})" if text else "another owner"
