"""The local durable spool: an LMDB environment owned by one process.

Sub-databases:

* ``pending``  - messages not yet acknowledged by the receiver; key = the 16 bytes of the UUIDv7
  message id, so a cursor walks them oldest first; value = `Entry.to_value()`.
* ``rejected`` - messages the receiver refused as invalid; same key; value = a JSON line with the
  reason, a newline, then the pending value. They stay until resent or purged.
* ``meta``     - the spool format version.

The environment is opened with sync enabled, so every committed write transaction is fsync'd:
once `put()`/`append()` returns, the message survives a process kill or a power cut.
Every access goes through one lock; callers in async code run these methods in a thread.

A write that fails because the disk is full (ENOSPC, EDQUOT, EFBIG, or LMDB's "short write"
EIO on a full filesystem) raises `SpoolDiskFullError`: LMDB aborts the transaction before it
touches the meta page, so what was committed earlier stays intact and the spool stays usable.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import lmdb

from msgbus_client.errors import (
    SpoolError,
    SpoolFormatError,
    SpoolFullError,
    SpoolLockedError,
    disk_full_error,
)
from msgbus_client.ids import now_ms, rfc3339_ms
from msgbus_client.lockfile import LOCK_FILE_NAME, SpoolDirLock
from msgbus_client.message import Entry

log = logging.getLogger("msgbus_client")

FORMAT_VERSION = b"1"
DEFAULT_MAX_SPOOL_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_SLOTS = 64
SLOT_PREFIX = "slot-"
DATA_FILE_NAME = "data.mdb"
LMDB_LOCK_FILE_NAME = "lock.mdb"
PENDING_DB, REJECTED_DB, META_DB = b"pending", b"rejected", b"meta"
MAX_DBS = 4
_MAP_HEADROOM_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RejectedMessage:
    """A message the receiver refused, with the reason it gave."""

    message_id: str
    destination: str
    status: int
    error: Any  # the receiver's error JSON (usually {"error", "message", "field"}) or its text
    rejected_at: str
    payload: bytes  # the single-endpoint JSON body as it was sent

    @property
    def message(self) -> dict[str, Any]:
        """The sent JSON document (message_id, created_at, body or body_base64, ...)."""
        doc: dict[str, Any] = json.loads(self.payload)
        return doc


@dataclass(frozen=True, slots=True)
class SpoolStats:
    pending: int
    rejected: int
    used_bytes: int
    max_bytes: int
    commits: int  # write transactions (= fsyncs) since this Spool was opened


class Spool:
    """Durable local queue of outgoing messages in `spool_dir` (created if missing).

    Raises SpoolLockedError when another process or client already owns the dir.
    """

    def __init__(
        self,
        spool_dir: str | PathLike[str],
        *,
        max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
    ) -> None:
        if max_spool_bytes <= 0:
            raise ValueError("max_spool_bytes must be > 0")
        self.path = Path(spool_dir)
        self.max_bytes = max_spool_bytes
        self.path.mkdir(parents=True, exist_ok=True)
        self._dir_lock = SpoolDirLock(self.path)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._commits = 0
        self._max_map_bytes = max_spool_bytes * 8 + _MAP_HEADROOM_BYTES
        self._env: lmdb.Environment | None = None
        try:
            self._env = lmdb.open(
                str(self.path),
                map_size=max_spool_bytes * 2 + _MAP_HEADROOM_BYTES,
                max_dbs=MAX_DBS,
                sync=True,
                metasync=True,
                readahead=False,
            )
            self._env.reader_check()  # clear reader slots left by killed processes
            self._pending = self._env.open_db(PENDING_DB)
            self._rejected = self._env.open_db(REJECTED_DB)
            self._meta = self._env.open_db(META_DB)
            self._check_format()
            self._used = self._measure()
        except BaseException as exc:
            if self._env is not None:
                self._env.close()
                self._env = None
            self._dir_lock.release()
            if not isinstance(exc, lmdb.Error):
                raise
            raise disk_full_error(exc, self.path / DATA_FILE_NAME) or SpoolError(
                f"cannot open the LMDB spool in {self.path}: {exc}"
            ) from exc
        log.info(
            "msgbus_client spool %s opened: %d pending, %d rejected",
            self.path,
            self.pending_count(),
            self.rejected_count(),
        )

    @classmethod
    def open_slot(
        cls,
        root: str | PathLike[str],
        *,
        max_slots: int = DEFAULT_MAX_SLOTS,
        max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
    ) -> Spool:
        """Open the first free `root/slot-N` (N = 0 .. max_slots-1) for this process.

        Several processes of one application can then share one `root`: each owns a slot (its
        dir lock), and a restarted process takes the lowest free slot, so it picks up what a dead
        one left there. Raises SpoolLockedError when every slot is owned by a live process.
        """
        if max_slots <= 0:
            raise ValueError("max_slots must be > 0")
        base = Path(root)
        for n in range(max_slots):
            try:
                return cls(base / f"{SLOT_PREFIX}{n}", max_spool_bytes=max_spool_bytes)
            except SpoolLockedError:
                continue
        raise SpoolLockedError(
            f"all {max_slots} spool slots under {base} are in use by live processes; "
            "raise max_slots or give this process a spool root of its own"
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._env is None:
                return
            self._env.close()
            self._env = None
        self._dir_lock.release()

    @property
    def closed(self) -> bool:
        return self._env is None

    def remove(self) -> bool:
        """Close the spool and delete its files and dir; only when nothing is left in it.

        The dir lock is held until the files are gone, so no other process can open the spool
        half-deleted. Returns False (after deleting the spool files) when the dir itself stays,
        because it holds files that are not the spool's or a new owner created a lock in it.
        Raises SpoolError if messages are pending or rejected.
        """
        with self._lock:
            left = self._count_unlocked(self._pending) + self._count_unlocked(self._rejected)
            if left:
                raise SpoolError(f"spool {self.path} still holds {left} message(s); not removed")
            self._open_env().close()
            self._env = None
            for name in (DATA_FILE_NAME, LMDB_LOCK_FILE_NAME, LOCK_FILE_NAME):
                (self.path / name).unlink(missing_ok=True)
            try:
                self.path.rmdir()
                gone = True
            except OSError as exc:
                log.warning("msgbus_client: spool files removed but %s stays: %s", self.path, exc)
                gone = False
        self._dir_lock.release()
        return gone

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback()` whenever messages become pending outside put()/append()."""
        self._listeners.append(callback)

    # -- writes ---------------------------------------------------------------------------------

    def put(self, entry: Entry) -> None:
        """Durably add one message (one fsync'd transaction). Raises SpoolFullError."""
        if self.append([entry]):
            raise self.full_error(entry)

    def append(self, entries: Sequence[Entry]) -> list[Entry]:
        """Durably add `entries` in one fsync'd transaction; return those refused for space."""
        refused: list[Entry] = []

        def work(txn: lmdb.Transaction[bytes], used: int) -> int:
            refused.clear()
            items: list[tuple[bytes, bytes]] = []
            for entry in entries:
                if used + entry.size > self.max_bytes:
                    refused.append(entry)
                    continue
                items.append((entry.key, entry.to_value()))
                used += entry.size
            # one call for all: each separate put() would give up the GIL and wait to get it back
            # while concurrent senders run, which slows the group commit down
            txn.cursor(db=self._pending).putmulti(items)
            return used

        with self._lock:
            self._write(work)
        return refused

    def settle(
        self,
        acked: Iterable[Entry],
        rejected: Iterable[tuple[Entry, int, Any]] = (),
    ) -> None:
        """In one transaction: drop acknowledged messages; move refused ones to `rejected`."""
        acked = list(acked)
        rejected = list(rejected)
        if not acked and not rejected:
            return

        def work(txn: lmdb.Transaction[bytes], used: int) -> int:
            for entry in acked:
                used -= self._drop(txn, entry.key, self._pending)
            for entry, status, error in rejected:
                value = txn.pop(entry.key, db=self._pending)
                if value is None:
                    continue
                reason = {
                    "destination": entry.destination,
                    "status": status,
                    "error": error,
                    "rejected_at": rfc3339_ms(now_ms()),
                }
                record = json.dumps(reason).encode() + b"\n" + value
                txn.put(entry.key, record, db=self._rejected)
                used += len(record) - len(value)
            return used

        with self._lock:
            self._write(work)

    # -- reads ----------------------------------------------------------------------------------

    def oldest(
        self,
        limit: int,
        max_bytes: int,
        skip: Container[bytes] = frozenset(),
    ) -> list[Entry]:
        """Up to `limit` pending messages, oldest first, skipping keys in `skip`.

        Stops before `max_bytes` of payload, but always returns at least one message if any.
        """
        found: list[Entry] = []
        total = 0
        with self._lock:
            env = self._open_env()
            with env.begin() as txn:
                for key, value in txn.cursor(db=self._pending):
                    if key in skip:
                        continue
                    entry = Entry.from_record(key, value)
                    if found and total + len(entry.payload) > max_bytes:
                        break
                    found.append(entry)
                    total += len(entry.payload)
                    if len(found) >= limit:
                        break
        return found

    def pending_count(self) -> int:
        return self._count(self._pending)

    def oldest_message_ms(self) -> int | None:
        """Creation time (unix ms) of the oldest pending message, None if nothing is pending.

        Read from the first key's 48-bit UUIDv7 timestamp, so it costs one cursor step, not a scan.
        """
        with self._lock:
            env = self._open_env()
            with env.begin() as txn:
                return first_key_ms(txn, self._pending)

    def rejected_count(self) -> int:
        return self._count(self._rejected)

    @property
    def used_bytes(self) -> int:
        """Bytes of keys and values in `pending` and `rejected` (what max_spool_bytes limits)."""
        return self._used

    def stats(self) -> SpoolStats:
        return SpoolStats(
            pending=self.pending_count(),
            rejected=self.rejected_count(),
            used_bytes=self._used,
            max_bytes=self.max_bytes,
            commits=self._commits,
        )

    # -- rejected messages ----------------------------------------------------------------------

    def list_rejected(self, limit: int | None = None) -> list[RejectedMessage]:
        """Rejected messages, oldest first (all of them, or the first `limit`)."""
        found: list[RejectedMessage] = []
        with self._lock:
            env = self._open_env()
            with env.begin() as txn:
                for key, record in txn.cursor(db=self._rejected):
                    if limit is not None and len(found) >= limit:
                        break
                    found.append(decode_rejected(key, record))
        return found

    def resend_rejected(self, message_id: str) -> bool:
        """Move one rejected message back to pending (same id); False if it is not there."""
        if not self._requeue_rejected([_key(message_id)]):
            return False
        log.info("msgbus_client: rejected message %s queued again", message_id)
        return True

    def resend_all_rejected(self) -> int:
        """Move every rejected message back to pending in one transaction; return how many."""
        moved = self._requeue_rejected(None)
        if moved:
            log.info("msgbus_client: %d rejected message(s) queued again", moved)
        return moved

    def purge_rejected(self, message_id: str | None = None) -> int:
        """Delete one rejected message, or all when `message_id` is None; return how many."""
        removed = 0

        def work(txn: lmdb.Transaction[bytes], used: int) -> int:
            nonlocal removed
            if message_id is not None:
                keys = [_key(message_id)]
            else:
                keys = [bytes(k) for k, _ in txn.cursor(db=self._rejected)]
            removed = 0
            for key in keys:
                freed = self._drop(txn, key, self._rejected)
                removed += 1 if freed else 0
                used -= freed
            return used

        with self._lock:
            self._write(work)
        if removed:
            log.warning("msgbus_client: purged %d rejected message(s)", removed)
        return removed

    def _requeue_rejected(self, keys: list[bytes] | None) -> int:
        """Move rejected messages (those keys, or all) back to pending in one transaction and
        tell the listeners; return how many moved."""
        moved = 0

        def work(txn: lmdb.Transaction[bytes], used: int) -> int:
            nonlocal moved
            moved = 0  # _write() may run this again after growing the map
            chosen = keys if keys is not None else [
                bytes(k) for k, _ in txn.cursor(db=self._rejected)
            ]
            for key in chosen:
                record = txn.pop(key, db=self._rejected)
                if record is None:
                    continue
                value = record.split(b"\n", 1)[1]
                txn.put(key, value, db=self._pending)
                used += len(value) - len(record)
                moved += 1
            return used

        with self._lock:
            self._write(work)
        if moved:
            for callback in list(self._listeners):
                callback()
        return moved

    # -- internals ------------------------------------------------------------------------------

    def _write(self, work: Callable[[lmdb.Transaction[bytes], int], int]) -> None:
        """Run `work(txn, used) -> new used` in one write transaction (fsync'd on commit).

        LMDB's map (its maximum file size) starts at twice max_spool_bytes; if page overhead
        (e.g. large values use whole pages) still fills it, it doubles, up to 8 times
        max_spool_bytes, and the transaction runs again. A disk-full failure raises
        SpoolDiskFullError; LMDB has aborted the transaction. Caller holds self._lock.
        """
        env = self._open_env()
        while True:
            try:
                with env.begin(write=True) as txn:
                    used = work(txn, self._used)
            except lmdb.MapFullError:
                size = env.info()["map_size"]
                if size >= self._max_map_bytes:
                    raise SpoolFullError(f"the LMDB map of spool {self.path} is full") from None
                size = min(size * 2, self._max_map_bytes)
                log.warning("msgbus_client: spool %s map full; growing it to %d", self.path, size)
                env.set_mapsize(size)
                continue
            except lmdb.Error as exc:
                full = disk_full_error(exc, self.path / DATA_FILE_NAME)
                if full is None:
                    raise
                raise full from exc
            self._used = used
            self._commits += 1
            return

    def _open_env(self) -> lmdb.Environment:
        if self._env is None:
            raise SpoolError(f"spool {self.path} is closed")
        return self._env

    def full_error(self, entry: Entry) -> SpoolFullError:
        return SpoolFullError(
            f"spool {self.path} is full ({self._used} of max_spool_bytes={self.max_bytes} used); "
            f"message {entry.message_id} ({entry.size} bytes) was not written. The receiver is "
            "probably unreachable; retry later or raise max_spool_bytes."
        )

    @staticmethod
    def _drop(txn: lmdb.Transaction[bytes], key: bytes, db: Any) -> int:
        """Delete `key` from `db`; return the bytes freed (0 if it was not there)."""
        value = txn.pop(key, db=db)
        return 0 if value is None else len(key) + len(value)

    def _count(self, db: Any) -> int:
        with self._lock:
            return self._count_unlocked(db)

    def _count_unlocked(self, db: Any) -> int:
        with self._open_env().begin() as txn:
            return int(txn.stat(db)["entries"])

    def _measure(self) -> int:
        with self._open_env().begin() as txn:
            return measure_bytes(txn, (self._pending, self._rejected))

    def _check_format(self) -> None:
        env = self._open_env()
        with env.begin(write=True) as txn:
            found = txn.get(b"format", db=self._meta)
            if found is None:
                txn.put(b"format", FORMAT_VERSION, db=self._meta)
            elif found != FORMAT_VERSION:
                raise format_error(self.path, found)


def format_error(path: Path, found: bytes | None) -> SpoolFormatError:
    """The error for a spool whose recorded format is not the one this version reads."""
    return SpoolFormatError(
        f"spool {path} has format {found!r}; this msgbus_client reads {FORMAT_VERSION!r}. "
        "Send what it holds with the version that wrote it."
    )


def first_key_ms(txn: lmdb.Transaction[bytes], db: Any) -> int | None:
    """The UUIDv7 timestamp of the first (oldest) key of `db`, None if it is empty."""
    cursor = txn.cursor(db=db)
    if not cursor.first():
        return None
    return int.from_bytes(bytes(cursor.key())[:6], "big")


def measure_bytes(txn: lmdb.Transaction[bytes], dbs: Iterable[Any]) -> int:
    """Bytes of keys and values in `dbs`: what max_spool_bytes limits."""
    return sum(len(k) + len(v) for db in dbs for k, v in txn.cursor(db=db))


def _key(message_id: str) -> bytes:
    try:
        return uuid.UUID(message_id).bytes
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a message id: {message_id!r}") from exc


def decode_rejected(key: bytes, record: bytes) -> RejectedMessage:
    """A `rejected` record (JSON reason line + pending value) as a RejectedMessage."""
    head, value = bytes(record).split(b"\n", 1)
    reason = json.loads(head)
    entry = Entry.from_record(key, value)
    return RejectedMessage(
        message_id=entry.message_id,
        destination=entry.destination,
        status=int(reason["status"]),
        error=reason.get("error"),
        rejected_at=str(reason.get("rejected_at", "")),
        payload=entry.payload,
    )
