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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Iterable, Sequence
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

# (unique key or None, the (queue, value) entries to append unless the key was seen)
Item = tuple[bytes | None, list[tuple[str, bytes]]]


class LocalQueue:
    """Named FIFO queues in one LMDB environment. Reads run on the caller's thread; writes on
    one dedicated writer thread."""

    def __init__(
        self, path: Path, queues: Sequence[str], *, max_bytes: int,
        map_size: int = _DEFAULT_MAP_SIZE, dedupe_window_s: float | None = None,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_bytes = max_bytes
        self.dedupe_window_s = dedupe_window_s
        # sync=False: commits are flushed explicitly by append(), deletes lazily.
        self._env = lmdb.open(
            str(path), map_size=max(map_size, max_bytes * 2), max_dbs=len(queues) + 3,
            sync=False, metasync=True, readahead=False,
        )
        self._dbs = {name: self._env.open_db(name.encode()) for name in queues}
        self._seen = self._env.open_db(_SEEN_DB)
        self._seen_by_time = self._env.open_db(_SEEN_BY_TIME_DB)
        self._next_seq = {name: self._last_seq(name) + 1 for name in queues}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lmdb-{path.name}")
        self._pending: list[tuple[list[Item], asyncio.Future[list[bool]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._used_bytes = self._measure_bytes()
        self._appended = {name: asyncio.Event() for name in queues}

    def _last_seq(self, queue: str) -> int:
        with self._env.begin(db=self._dbs[queue]) as txn:
            cursor = txn.cursor()
            return _KEY.unpack(cursor.key())[0] if cursor.last() else 0

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
        return self._used_bytes

    def depth(self, queue: str) -> int:
        with self._env.begin() as txn:
            return int(txn.stat(self._dbs[queue])["entries"])

    async def append(self, entries: list[tuple[str, bytes]]) -> None:
        """Durably append (queue, value) entries, all or nothing. Raises BufferFull when the
        queue is over its size limit."""
        await self.append_new([(None, entries)])

    async def append_new(self, items: list[Item]) -> list[bool]:
        """Durably append each item's entries unless its unique key was appended within the
        dedupe window (or earlier in `items`); returns, per item, whether it was appended.
        A None key is always appended. Raises BufferFull like append()."""
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
            for queue in {q for items, _ in batch for _, entries in items for q, _ in entries}:
                self._appended[queue].set()

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
                for items in groups:
                    results.append([self._put_item(txn, item, seqs, now_ms) for item in items])
                if self.dedupe_window_s is not None:
                    self._prune_seen(txn, now_ms, _PRUNE_PER_ITEM * sum(map(len, groups)))
        except lmdb.MapFullError as exc:
            raise BufferFull(f"local buffer {self.path} is full: {exc}") from exc
        self._env.sync(True)
        self._next_seq = seqs
        self._used_bytes = self._measure_bytes()
        return results

    def _put_item(self, txn: lmdb.Transaction[bytes], item: Item, seqs: dict[str, int],
                  now_ms: int) -> bool:
        key, entries = item
        if key is not None:
            if not txn.put(key, _KEY.pack(now_ms), db=self._seen, overwrite=False):
                return False
            txn.put(_KEY.pack(now_ms) + key, b"", db=self._seen_by_time)
        for queue, value in entries:
            txn.put(_KEY.pack(seqs[queue]), value, db=self._dbs[queue], append=True)
            seqs[queue] += 1
        return True

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

    def read(self, queue: str, limit: int, after: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """Up to `limit` oldest (key, value) entries of a queue, optionally after a key."""
        out: list[tuple[bytes, bytes]] = []
        with self._env.begin(db=self._dbs[queue], buffers=False) as txn:
            cursor = txn.cursor()
            found = cursor.set_range(after + b"\x00") if after else cursor.first()
            while found and len(out) < limit:
                out.append((cursor.key(), cursor.value()))
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
