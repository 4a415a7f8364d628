"""Errors raised by msgbus_client.

Tree::

    MsgbusClientError
    ├── InvalidMessageError        (also a TypeError and a ValueError) bad input to send()
    │   └── SchemaValidationError  validate=True: the message breaks its destination's schema
    ├── ClientClosedError          send() after close()
    ├── SpoolError                 the local LMDB spool cannot be used
    │   ├── SpoolLockedError       another process (or client) owns the spool dir
    │   ├── SpoolFullError         max_spool_bytes reached; nothing was written
    │   ├── SpoolDiskFullError     the disk (or quota, or file size limit) is full; nothing was
    │   │                          written, what was spooled before is intact
    │   ├── SpoolNotIdleError      spooltools: the spool was written too recently to be rescued
    │   └── SpoolFormatError       the dir holds a spool this version cannot read
    └── WebhookVerificationError   verify_push(): the push is not authentic or too old

Network failures never surface as exceptions from send(): a spooled message stays in the spool
until the resender delivers it.

`disk_full_error()` recognises an LMDB write failure caused by a full disk.
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

_DISK_FULL_ERRNOS = {
    errno.ENOSPC: "the filesystem is full (ENOSPC)",
    errno.EDQUOT: "the disk quota is exceeded (EDQUOT)",
    errno.EFBIG: "the file size limit is reached (EFBIG, RLIMIT_FSIZE)",
}
# LMDB reports a partial write as EIO ("short write, filesystem full?"); that counts as disk-full
# when the filesystem has less than this left, or the file is this close to RLIMIT_FSIZE.
_NEARLY_FULL_BYTES = 1024 * 1024


class MsgbusClientError(Exception):
    """Base of every error this library raises on purpose."""


class InvalidMessageError(MsgbusClientError, TypeError, ValueError):
    """send() got something it cannot encode; nothing was spooled.

    It is both a TypeError and a ValueError so that callers may catch whichever feels natural.
    """


class SchemaValidationError(InvalidMessageError):
    """validate=True: the message breaks its destination's payload schema; nothing was spooled.
    `pointer` is the JSON pointer of the value at fault in the message, `keyword` the JSON
    Schema rule it breaks, `version` the schema version checked."""

    def __init__(self, message: str, *, destination: str, pointer: str, keyword: str,
                 version: int) -> None:
        super().__init__(message)
        self.destination, self.pointer, self.keyword = destination, pointer, keyword
        self.version = version


class ClientClosedError(MsgbusClientError):
    """The client was closed; create a new one to send again."""


class SpoolError(MsgbusClientError):
    """The local spool cannot be used."""


class SpoolLockedError(SpoolError):
    """Another process (or another client in this process) already owns this spool dir."""


class SpoolFullError(SpoolError):
    """The spool reached max_spool_bytes; the message was not written and not sent."""


class SpoolDiskFullError(SpoolError):
    """A spool write failed because the disk, the quota or the file size limit is full.

    The transaction was aborted: nothing of it was written, and what was committed earlier is
    intact. The spool stays usable; writes succeed again once there is room.
    """


class SpoolNotIdleError(SpoolError):
    """The spool was written too recently to count as orphaned; it is not rescued."""


class SpoolFormatError(SpoolError):
    """The spool dir was written by an incompatible version of msgbus_client."""


class WebhookVerificationError(MsgbusClientError):
    """A push failed signature or timestamp verification; do not process it."""


def disk_full_error(exc: Exception, data_file: Path) -> SpoolDiskFullError | None:
    """A SpoolDiskFullError for a write to `data_file` (the spool's data.mdb) that failed for
    lack of space, else None.

    py-lmdb raises lmdb.DiskError for ENOSPC and a plain lmdb.Error for EDQUOT and EFBIG; the
    errno is its `code` (py-lmdb >= 3) or only its strerror text (older versions). LMDB turns a
    partial write into EIO, which counts when the disk or the file size limit is nearly reached.
    """
    code = _errno_of(exc)
    reason = _DISK_FULL_ERRNOS.get(code) if code is not None else None
    if reason is None and code == errno.EIO and _nearly_full(data_file):
        reason = "the filesystem or the file size limit is full (short write)"
    if reason is None:
        return None
    return SpoolDiskFullError(
        f"cannot write to spool {data_file.parent}: {reason} ({exc}). Nothing of this write was "
        "stored and the messages spooled before are intact. Free space on that filesystem (or "
        "raise the quota or file size limit), then send again."
    )


def _errno_of(exc: Exception) -> int | None:
    code = getattr(exc, "code", 0)
    if isinstance(code, int) and code > 0:
        return code
    text = str(exc)
    return next((c for c in (*_DISK_FULL_ERRNOS, errno.EIO) if os.strerror(c) in text), None)


def _nearly_full(data_file: Path) -> bool:
    try:
        fs = os.statvfs(data_file.parent)
        size = data_file.stat().st_size
    except OSError:
        return False
    if fs.f_bavail * fs.f_frsize < _NEARLY_FULL_BYTES:
        return True
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    return soft != resource.RLIM_INFINITY and size + _NEARLY_FULL_BYTES > soft
