"""Durable local FIFO queues on LMDB, with group commit.

One LMDB environment holds several named queues. `append()` is the durability point: it returns
only after the entries are fsync'd. Concurrent appends share one transaction and one fsync
(group commit): while a commit is on disk, new appends gather for the next one.

Deletes are not fsync'd on their own; after a crash a deleted entry may come back once, which
the consumers of these queues tolerate (every write they make is idempotent).

With `dedupe_window_s`, `append_new()` remembers each item's unique key (a message id) for that
long, in the same transaction as the append, and skips an item whose key it has seen: a client
re-sending a message it is not sure about is then accepted once. Keys are forgotten through a
second index ordered by the time they were seen, pruned a little at every commit.

Several processes may open one environment: e.g. one appends while another flushes. A process
that flushes learns of new entries from `notify_appended()` (the appender's `on_commit` hook can
ring it across processes) or, at the latest, when its wait times out.

A queue may be split into partitions (e.g. one per destination, so that each can be flushed at
its own rate): an entry's target is then `(queue, partition)` instead of `queue`, and its key
is `partition NUL seq`, so each partition is a FIFO of its own inside the queue's database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lmdb

from msgbus.errors import BufferFull, Unavailable

log = logging.getLogger(__name__)

_KEY = struct.Struct(">Q")
_DEFAULT_MAP_SIZE = 64 * 1024**3  # address space only; the file grows with use
_SEEN_DB = b"_seen"  # unique key -> when it was seen (ms)
_SEEN_BY_TIME_DB = b"_seen_by_time"  # (ms, unique key) -> ""
_PRUNE_PER_ITEM = 2  # expired keys pruned per appended item: pruning outpaces inserting

# Where an entry goes: a queue, or a (queue, partition) of a partitioned queue.
Target = str | tuple[str, str]
# (unique key or None, the (target, value) entries to append unless the key was seen)
Item = tuple[bytes | None, list[tuple[Target, bytes]]]
_PARTITION_END = b"\x00"


def _partition_prefix(partition: str) -> bytes:
    return partition.encode() + _PARTITION_END


class LocalQueue:
    """Named FIFO queues in one LMDB environment. Reads run on the caller's thread; writes on
    one dedicated writer thread."""

    def __init__(
        self, path: Path, queues: Sequence[str], *, max_bytes: int,
        map_size: int = _DEFAULT_MAP_SIZE, dedupe_window_s: float | None = None,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_bytes = max_bytes
        self.dedupe_window_s = dedupe_window_s
        self._on_commit = on_commit  # called on the event loop after each append is durable
        # sync=False: commits are flushed explicitly by append(), deletes lazily.
        self._env = lmdb.open(
            str(path), map_size=max(map_size, max_bytes * 2), max_dbs=len(queues) + 3,
            sync=False, metasync=True, readahead=False,
        )
        self._dbs = {name: self._env.open_db(name.encode()) for name in queues}
        self._seen = self._env.open_db(_SEEN_DB)
        self._seen_by_time = self._env.open_db(_SEEN_BY_TIME_DB)
        # next sequence number per queue (key None) and per partition, found on first use
        self._next_seq: dict[tuple[str, str | None], int] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lmdb-{path.name}")
        self._pending: list[tuple[list[Item], asyncio.Future[list[bool]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._used_bytes = self._measure_bytes()
        self._appended = {name: asyncio.Event() for name in queues}

    def _last_seq(self, txn: lmdb.Transaction[bytes], queue: str, partition: str | None) -> int:
        cursor = txn.cursor(db=self._dbs[queue])
        if partition is None:
            return _KEY.unpack(cursor.key())[0] if cursor.last() else 0
        prefix = _partition_prefix(partition)
        # the last key of the partition is just before the first key after it
        found = cursor.prev() if cursor.set_range(partition.encode() + b"\x01") else cursor.last()
        key = cursor.key()
        if not found or not key.startswith(prefix) or len(key) != len(prefix) + _KEY.size:
            return 0
        return int(_KEY.unpack(key[len(prefix):])[0])

    def _measure_bytes(self) -> int:
        with self._env.begin() as txn:
            total = 0
            for db in self._dbs.values():
                st = txn.stat(db)
                pages = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
                total += st["psize"] * pages
            return total

    @property
    def used_bytes(self) -> int:
        """Bytes in use now (measured: another process may have flushed entries)."""
        self._used_bytes = self._measure_bytes()
        return self._used_bytes

    def depth(self, queue: str) -> int:
        """Entries in a queue, all partitions together."""
        with self._env.begin() as txn:
            return int(txn.stat(self._dbs[queue])["entries"])

    def partitions(self, queue: str, limit: int = 100_000) -> list[str]:
        """The partitions of a partitioned queue that hold entries, in key order."""
        found_partitions: list[str] = []
        with self._env.begin(db=self._dbs[queue], buffers=False) as txn:
            cursor = txn.cursor()
            found = cursor.first()
            while found and len(found_partitions) < limit:
                partition = cursor.key().split(_PARTITION_END, 1)[0]
                found_partitions.append(partition.decode())
                found = cursor.set_range(partition + b"\x01")  # skip to the next partition
        return found_partitions

    async def append(self, entries: list[tuple[Target, bytes]]) -> None:
        """Durably append (queue, value) entries, all or nothing. Raises BufferFull when the
        queue is over its size limit."""
        await self.append_new([(None, entries)])

    async def append_new(self, items: list[Item]) -> list[bool]:
        """Durably append each item's entries unless its unique key was appended within the
        dedupe window (or earlier in `items`); returns, per item, whether it was appended.
        A None key is always appended. Raises BufferFull like append()."""
        if self._used_bytes >= self.max_bytes:
            # another process may have flushed it since our last commit measured it
            self._used_bytes = self._measure_bytes()
        if self._used_bytes >= self.max_bytes:
            raise BufferFull(f"local buffer {self.path} is full ({self._used_bytes} bytes)")
        if self.dedupe_window_s is None and any(key is not None for key, _ in items):
            raise ValueError("append_new() with keys needs a LocalQueue with dedupe_window_s")
        future: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_pending())
        return await future

    async def _flush_pending(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                results = await loop.run_in_executor(
                    self._writer, self._commit, [items for items, _ in batch])
            except Exception as exc:  # disk full, map full: every waiter learns why
                error = exc if isinstance(exc, BufferFull) else Unavailable(
                    f"local buffer {self.path} write failed: {exc}")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(error)
                continue
            for (_, fut), appended in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(appended)
            targets = {t for items, _ in batch for _, entries in items for t, _ in entries}
            for queue in {t if isinstance(t, str) else t[0] for t in targets}:
                self._appended[queue].set()
            if self._on_commit is not None:
                self._on_commit()

    def notify_appended(self) -> None:
        """Wake whoever waits for entries of any queue (another process appended some)."""
        for event in self._appended.values():
            event.set()

    async def wait_for_entries(self, queue: str, timeout_s: float) -> None:
        """Return when something was appended to `queue` since the last call, or on timeout."""
        event = self._appended[queue]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
        event.clear()

    def _commit(self, groups: list[list[Item]]) -> list[list[bool]]:
        seqs = dict(self._next_seq)
        results: list[list[bool]] = []
        now_ms = int(time.time() * 1000)
        try:
            with self._env.begin(write=True) as txn:
                # values to append per (queue, partition), in order; written below in bulk
                values: dict[tuple[str, str | None], list[bytes]] = {}
                seen_at: list[tuple[bytes, bytes]] = []
                for items in groups:
                    results.append(self._gather_items(txn, items, values, seen_at, now_ms))
                for slot, slot_values in values.items():
                    self._put_values(txn, slot, slot_values, seqs)
                if seen_at:
                    seen_at.sort()
                    txn.cursor(db=self._seen_by_time).putmulti(seen_at)
                if self.dedupe_window_s is not None:
                    self._prune_seen(txn, now_ms, _PRUNE_PER_ITEM * sum(map(len, groups)))
        except lmdb.MapFullError as exc:
            raise BufferFull(f"local buffer {self.path} is full: {exc}") from exc
        self._env.sync(True)
        self._next_seq = seqs
        self._used_bytes = self._measure_bytes()
        return results

    def _gather_items(self, txn: lmdb.Transaction[bytes], items: list[Item],
                      values: dict[tuple[str, str | None], list[bytes]],
                      seen_at: list[tuple[bytes, bytes]], now_ms: int) -> list[bool]:
        """Records the unique keys of `items` (the only per-item writes: whether a key was
        seen decides whether its item is appended) and gathers the values to append."""
        appended: list[bool] = []
        put, seen_db, now_key = txn.put, self._seen, _KEY.pack(now_ms)
        for key, entries in items:
            if key is not None:
                if not put(key, now_key, db=seen_db, overwrite=False):
                    appended.append(False)
                    continue
                seen_at.append((now_key + key, b""))
            for target, value in entries:
                slot = (target, None) if isinstance(target, str) else target
                slot_values = values.get(slot)
                if slot_values is None:
                    slot_values = values[slot] = []
                slot_values.append(value)
            appended.append(True)
        return appended

    def _put_values(self, txn: lmdb.Transaction[bytes], slot: tuple[str, str | None],
                    slot_values: list[bytes], seqs: dict[tuple[str, str | None], int]) -> None:
        """Appends values to one queue or partition with one putmulti: their keys are
        consecutive sequence numbers after the slot's last one."""
        queue, partition = slot
        first = seqs.get(slot)
        if first is None:
            first = self._last_seq(txn, queue, partition) + 1
        pack = _KEY.pack
        seq_range = range(first, first + len(slot_values))
        cursor = txn.cursor(db=self._dbs[queue])
        if partition is None:  # the keys come after every key of the queue
            cursor.putmulti(zip(map(pack, seq_range), slot_values, strict=True), append=True)
        else:  # ordered within the partition, which may be followed by others
            prefix = _partition_prefix(partition)
            cursor.putmulti([(prefix + pack(seq), value)
                             for seq, value in zip(seq_range, slot_values, strict=True)])
        seqs[slot] = first + len(slot_values)

    def _prune_seen(self, txn: lmdb.Transaction[bytes], now_ms: int, limit: int) -> None:
        """Forget up to `limit` keys seen before the dedupe window."""
        assert self.dedupe_window_s is not None
        cutoff = _KEY.pack(max(0, now_ms - int(self.dedupe_window_s * 1000)))
        cursor = txn.cursor(db=self._seen_by_time)
        found = cursor.first()
        while found and limit > 0 and cursor.key()[: _KEY.size] < cutoff:
            txn.delete(cursor.key()[_KEY.size :], db=self._seen)
            found = cursor.delete()
            limit -= 1

    def read(self, queue: str, limit: int, after: bytes | None = None, *,
             partition: str | None = None) -> list[tuple[bytes, bytes]]:
        """Up to `limit` oldest (key, value) entries of a queue (or of one of its partitions),
        optionally after a key."""
        out: list[tuple[bytes, bytes]] = []
        prefix = b"" if partition is None else _partition_prefix(partition)
        with self._env.begin(db=self._dbs[queue], buffers=False) as txn:
            cursor = txn.cursor()
            found = cursor.set_range(after + b"\x00" if after else prefix)
            while found and len(out) < limit:
                key = cursor.key()
                if not key.startswith(prefix):
                    break
                out.append((key, cursor.value()))
                found = cursor.next()
        return out

    async def delete(self, queue: str, keys: Iterable[bytes]) -> None:
        keys = list(keys)
        if keys:
            await asyncio.get_running_loop().run_in_executor(
                self._writer, self._delete, queue, keys)

    def _delete(self, queue: str, keys: list[bytes]) -> None:
        with self._env.begin(write=True, db=self._dbs[queue]) as txn:
            for key in keys:
                txn.delete(key)
        self._used_bytes = self._measure_bytes()

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._env.sync(True)
        self._env.close()
