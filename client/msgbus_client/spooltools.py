"""Spool dirs seen from outside their owner: inspect them, find orphans, rescue them.

These are what `msgbus spool ...` and the Kubernetes DaemonSet (`msgbus node-rescuer`, which
rescues the spools that pods left behind on a node) run, so both behave the same.

* `inspect_spool()` reads a spool without taking it over: it never takes the dir lock and opens
  LMDB read-only (a reader slot in lock.mdb, as any LMDB reader), so it works while a live client
  writes, and changes nothing.
* A spool is **orphaned** when no live process holds its lock and data.mdb has not been written
  for `min_idle_s`. The idle time covers a process that is about to restart on its dir.
* `rescue_spool()` takes the lock (no client can open the spool meanwhile), delivers everything
  with the client's own delivery code (`Deliverer`: batches, backoff, Retry-After, rejected
  messages moved aside), and removes the dir when nothing is left in it.

Open at most one view of a spool per process: LMDB (and py-lmdb >= 3 enforces it) must not open
the same environment twice in one process, so a spool this process owns is refused here.

`drain_spool` and `DrainReport` are the names of `rescue_spool` and `RescueReport` before 0.2,
deprecated: they go in the next release.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import httpx
import lmdb

from msgbus_client.delivery import Deliverer, open_spool
from msgbus_client.errors import SpoolError, SpoolLockedError, SpoolNotIdleError
from msgbus_client.ids import now_ms
from msgbus_client.lockfile import LOCK_FILE_NAME, is_held, owner_name
from msgbus_client.retry import ReceiverHealth, flush_request_timeout_s, flush_wait_s
from msgbus_client.settings import ClientSettings
from msgbus_client.spool import (
    DATA_FILE_NAME,
    DEFAULT_MAX_SPOOL_BYTES,
    FORMAT_VERSION,
    MAX_DBS,
    META_DB,
    PENDING_DB,
    REJECTED_DB,
    RejectedMessage,
    Spool,
    decode_rejected,
    first_key_ms,
    format_error,
    measure_bytes,
)
from msgbus_client.transport import HttpSender

log = logging.getLogger("msgbus_client")

DEFAULT_ORPHAN_IDLE_S = 600.0
MAX_SEARCH_DEPTH = 3

Progress = Callable[[int, int], None]  # (messages settled so far, messages to rescue)


@dataclass(frozen=True, slots=True)
class SpoolReport:
    """What a spool dir holds, and whether someone owns it."""

    path: Path
    pending: int
    rejected: int
    used_bytes: int
    oldest_age_s: float | None  # age of the oldest pending message; None when none is pending
    last_write_age_s: float  # since data.mdb was last written
    held_by: str | None  # "pid=... host=..." of the live owner, None when nobody holds it

    def orphaned(self, min_idle_s: float = DEFAULT_ORPHAN_IDLE_S) -> bool:
        """No live owner, and not written for `min_idle_s`: safe to rescue and remove."""
        return self.held_by is None and self.last_write_age_s >= min_idle_s


@dataclass(frozen=True, slots=True)
class RescueReport:
    path: Path
    delivered: int  # acknowledged by the receiver during this rescue
    rejected: int  # in the spool's rejected area at the end (refused as invalid)
    left: int  # still pending at the end (receiver unreachable until the timeout)
    removed: bool  # the spool dir was deleted
    seconds: float


def is_spool_dir(path: str | PathLike[str]) -> bool:
    """Whether `path` looks like a spool dir (data.mdb and spool.lock in it)."""
    base = Path(path)
    return (base / DATA_FILE_NAME).is_file() and (base / LOCK_FILE_NAME).is_file()


def inspect_spool(path: str | PathLike[str]) -> SpoolReport:
    """Counts, ages and owner of the spool at `path`, read-only (see the module docstring)."""
    base = Path(path)
    held_by = _probe(base)
    age_s = _last_write_age_s(base)
    with _snapshot(base) as (txn, pending, rejected):
        oldest_ms = first_key_ms(txn, pending)
        return SpoolReport(
            path=base,
            pending=int(txn.stat(pending)["entries"]),
            rejected=int(txn.stat(rejected)["entries"]),
            used_bytes=measure_bytes(txn, (pending, rejected)),
            oldest_age_s=None if oldest_ms is None else max(0.0, (now_ms() - oldest_ms) / 1000),
            last_write_age_s=age_s,
            held_by=held_by,
        )


def list_rejected(path: str | PathLike[str], limit: int | None = None) -> list[RejectedMessage]:
    """The rejected messages of the spool at `path`, oldest first; read-only like inspect."""
    base = Path(path)
    _probe(base)
    found: list[RejectedMessage] = []
    with _snapshot(base) as (txn, _pending, rejected):
        for key, record in txn.cursor(db=rejected):
            if limit is not None and len(found) >= limit:
                break
            found.append(decode_rejected(bytes(key), bytes(record)))
    return found


def find_spools(root: str | PathLike[str], max_depth: int = MAX_SEARCH_DEPTH) -> list[Path]:
    """Spool dirs at `root` or up to `max_depth` levels below it, in name order.

    Symlinks are not followed, and a spool dir is not searched further.
    """
    base = Path(root)
    if not base.is_dir():
        raise SpoolError(f"{base} is not a directory")
    found: list[Path] = []
    _walk(base, max_depth, found)
    return found


def find_orphans(
    root: str | PathLike[str], min_idle_s: float = DEFAULT_ORPHAN_IDLE_S
) -> list[SpoolReport]:
    """Reports of the orphaned spools under `root`; unreadable ones are logged and skipped."""
    orphans: list[SpoolReport] = []
    for path in find_spools(root):
        try:
            report = inspect_spool(path)
        except SpoolError as exc:
            log.warning("msgbus_client: skipping %s: %s", path, exc)
            continue
        if report.orphaned(min_idle_s):
            orphans.append(report)
    return orphans


def open_for_maintenance(path: str | PathLike[str]) -> Spool:
    """Take over the spool at `path` (its lock) to change it, e.g. resend or purge rejected
    messages. Refuses a dir that is not a spool, and one a live process holds."""
    base = Path(path)
    _require_spool(base)
    try:
        return Spool(base, max_spool_bytes=_max_bytes(base))
    except SpoolLockedError as exc:
        raise SpoolLockedError(
            f"spool {base} is held by {is_held(base) or 'a live process'}: change it through "
            "that client's API (client.spool.resend_rejected / purge_rejected), or stop the "
            "process first"
        ) from exc


def rescue_spool(
    path: str | PathLike[str],
    receiver_url: str,
    api_key: str,
    *,
    min_idle_s: float = 0,
    timeout_s: float = 300,
    remove: bool = True,
    progress: Progress | None = None,
    transport: httpx.BaseTransport | None = None,
) -> RescueReport:
    """Send everything pending in the orphaned spool at `path` to the receiver, oldest first.

    Refuses (SpoolLockedError) a spool a live process holds, and (SpoolNotIdleError) one written
    less than `min_idle_s` ago. Holds the spool's lock while it runs. Stops when nothing is
    pending or after `timeout_s`; calls `progress(settled, total)` after each batch. Rejected
    messages go to the rejected area as usual. With `remove`, the dir is deleted when nothing
    is left in it (pending or rejected); otherwise it is kept for a later rescue or the CLI.
    """
    started = time.monotonic()
    base = Path(path)
    _refuse_unless_orphaned(inspect_spool(base), min_idle_s)
    settings = ClientSettings(
        receiver_url=receiver_url, spool_dir=base, max_spool_bytes=_max_bytes(base)
    )
    spool, sender, health = _open_for_rescue(base, settings, api_key, transport)
    try:
        _refuse_if_written(base, min_idle_s)  # again, now that nobody else can write it
        deliverer = Deliverer(spool, sender, health)
        delivered = _deliver_all(
            spool, deliverer, health, settings, deadline=started + timeout_s, progress=progress
        )
        left, rejected = spool.pending_count(), spool.rejected_count()
        removed = remove and not left and not rejected and spool.remove()
    finally:
        sender.close()
        spool.close()
    report = RescueReport(base, delivered, rejected, left, removed, time.monotonic() - started)
    log.info("msgbus_client: rescued %s: %s", base, report)
    return report


@functools.wraps(rescue_spool)
def drain_spool(*args: Any, **kwargs: Any) -> RescueReport:
    """Deprecated: `rescue_spool` (its name before 0.2; it goes in the next release)."""
    warnings.warn("msgbus_client.spooltools.drain_spool is deprecated: use rescue_spool",
                  DeprecationWarning, stacklevel=2)
    return rescue_spool(*args, **kwargs)


DrainReport = RescueReport  # deprecated: its name before 0.2


# -- internals ----------------------------------------------------------------------------------


def _deliver_all(
    spool: Spool,
    deliverer: Deliverer,
    health: ReceiverHealth,
    settings: ClientSettings,
    *,
    deadline: float,
    progress: Progress | None,
) -> int:
    """Deliver batches, oldest first, until nothing is pending or the deadline; waits out the
    receiver's backoff (our own, or its Retry-After) like the resender. Returns how many the
    receiver acknowledged."""
    delivered = settled = 0
    total = spool.pending_count()  # nobody adds messages: the rescue holds the spool's lock
    while batch := spool.oldest(settings.max_batch_messages, settings.max_batch_bytes):
        wait_s = flush_wait_s(health, deadline)
        if wait_s is None:
            break
        time.sleep(wait_s)
        outcome = deliverer.deliver(batch, timeout_s=flush_request_timeout_s(deadline))
        delivered += len(outcome.acked)
        settled += len(outcome.acked) + len(outcome.rejected)
        if progress is not None:
            progress(settled, total)
    return delivered


def _open_for_rescue(
    path: Path, settings: ClientSettings, api_key: str, transport: httpx.BaseTransport | None
) -> tuple[Spool, HttpSender, ReceiverHealth]:
    if not api_key:
        raise ValueError("api_key must not be empty")
    try:
        spool = open_spool(settings)
    except SpoolLockedError as exc:
        raise _held_error(path, is_held(path)) from exc
    try:
        sender = HttpSender(settings, api_key, max_connections=2, transport=transport)
    except BaseException:
        spool.close()
        raise
    return spool, sender, ReceiverHealth.for_settings(settings)


def _refuse_unless_orphaned(report: SpoolReport, min_idle_s: float) -> None:
    if report.held_by is not None:
        raise _held_error(report.path, report.held_by)
    _refuse_if_written(report.path, min_idle_s, report.last_write_age_s)


def _refuse_if_written(path: Path, min_idle_s: float, age_s: float | None = None) -> None:
    age_s = _last_write_age_s(path) if age_s is None else age_s
    if age_s < min_idle_s:
        raise SpoolNotIdleError(
            f"spool {path} was written {age_s:.0f} s ago, less than the {min_idle_s:.0f} s it "
            "must be idle to count as orphaned (its process may be restarting); not rescued"
        )


def _held_error(path: Path, held_by: str | None) -> SpoolLockedError:
    return SpoolLockedError(
        f"spool {path} is held by {held_by or 'a live process'}: it is not orphaned, and its "
        "own client delivers it; not rescued"
    )


def _require_spool(path: Path) -> None:
    if not is_spool_dir(path):
        raise SpoolError(
            f"{path} is not a msgbus spool dir (it has no {DATA_FILE_NAME} and {LOCK_FILE_NAME})"
        )


def _probe(path: Path) -> str | None:
    """The live owner of the spool at `path` (see lockfile.is_held); refuses this process."""
    _require_spool(path)
    try:
        held_by = is_held(path)
    except OSError as exc:
        raise SpoolError(f"cannot read the lock of spool {path}: {exc}") from exc
    if held_by == owner_name():
        raise SpoolError(
            f"spool {path} is open in this process; use that Spool object (stats(), "
            "list_rejected(), ...) instead"
        )
    return held_by


def _last_write_age_s(path: Path) -> float:
    try:
        mtime = (path / DATA_FILE_NAME).stat().st_mtime
    except OSError as exc:
        raise SpoolError(f"cannot read spool {path}: {exc}") from exc
    return max(0.0, time.time() - mtime)


def _max_bytes(path: Path) -> int:
    """A max_spool_bytes that fits an existing spool whatever its owner configured."""
    try:
        size = (path / DATA_FILE_NAME).stat().st_size
    except OSError:
        size = 0
    return max(DEFAULT_MAX_SPOOL_BYTES, size)


@contextlib.contextmanager
def _snapshot(path: Path) -> Iterator[tuple[lmdb.Transaction[bytes], Any, Any]]:
    """A read transaction on the spool at `path` and its pending and rejected databases."""
    try:
        # map_size=0: map as much as the owner configured, so its commits while we read never
        # outgrow our map (MDB_MAP_RESIZED)
        env = lmdb.open(
            str(path),
            readonly=True,
            lock=True,
            create=False,
            max_dbs=MAX_DBS,
            map_size=0,
            readahead=False,
        )
    except lmdb.Error as exc:
        raise SpoolError(f"cannot read spool {path}: {exc}") from exc
    try:
        pending = env.open_db(PENDING_DB, create=False)
        rejected = env.open_db(REJECTED_DB, create=False)
        meta = env.open_db(META_DB, create=False)
        with env.begin() as txn:
            found = txn.get(b"format", db=meta)
            if found != FORMAT_VERSION:
                raise format_error(path, found)
            yield txn, pending, rejected
    except lmdb.Error as exc:
        raise SpoolError(f"cannot read spool {path}: {exc}") from exc
    finally:
        env.close()


def _walk(path: Path, depth_left: int, found: list[Path]) -> None:
    if is_spool_dir(path):
        found.append(path)
        return
    if depth_left <= 0:
        return
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _walk(Path(entry.path), depth_left - 1, found)
