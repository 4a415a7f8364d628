"""Group commit: concurrent send()s share one fsync'd spool transaction.

Thread flavour, leader/follower (as databases group WAL flushes): a sender that finds no commit
running becomes the leader and commits everything queued, its own message included, in one
transaction; senders arriving meanwhile queue up and wait. When the leader's commit ends it
releases the senders it committed and promotes the first queued sender to lead the next group.
Groups therefore grow with the load by themselves: while one fsync runs, the next group
gathers. There is no committer thread, so a lone sender pays no thread hand-off. Before it
commits, a leader waits up to `window_s` for senders that are already encoding their message
(never longer, and not at all when nobody is on the way).

asyncio flavour: one committer task commits whatever is queued (the commit runs in a worker
thread), and senders queue up while a commit runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from msgbus_client.errors import ClientClosedError
from msgbus_client.message import Entry

log = logging.getLogger("msgbus_client")

GroupResult = list[BaseException | None]

_MAX_GROUPS_PER_LEADER = 4  # at most ~2 ms of extra wait for one leader

QueuedT = TypeVar("QueuedT")


class _CommitQueue(Generic[QueuedT]):
    """What both flavours share: the queued senders, taken a group at a time, and no new ones
    once close() has begun."""

    def __init__(self, max_group: int) -> None:
        self._max_group = max_group
        self._queue: list[QueuedT] = []
        self._closing = False

    def _refuse_if_closing(self) -> None:
        if self._closing:
            raise ClientClosedError("the client is closed")

    def _take(self) -> list[QueuedT]:
        group = self._queue[: self._max_group]
        del self._queue[: self._max_group]
        return group


def _failed(exc: BaseException, size: int) -> GroupResult:
    """A commit that raised fails every sender of its group with the same error."""
    log.error("msgbus_client: group commit failed", exc_info=exc)
    return [exc] * size


class _Waiter:
    """One queued sender. `done` is held until the sender is released (a bare lock is the
    cheapest thing a thread can block on)."""

    __slots__ = ("done", "entry", "error", "next", "promoted")

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.error: BaseException | None = None
        self.promoted = False
        self.next: _Waiter | None = None
        self.done = threading.Lock()
        self.done.acquire()

    def wait(self) -> None:
        self.done.acquire()
        if self.next is not None:
            self.next.done.release()


class GroupCommitter(_CommitQueue[_Waiter]):
    """Thread flavour. `commit(build)` blocks until the built entry is durable."""

    def __init__(
        self, handle: Callable[[list[Entry]], GroupResult], *, window_s: float, max_group: int
    ) -> None:
        super().__init__(max_group)
        self._handle = handle
        self._window_s = window_s
        self._cond = threading.Condition(threading.Lock())
        self._arriving = 0  # senders encoding their message, about to queue
        self._lingering = False
        self._leading = False

    def commit(self, build: Callable[[], Entry]) -> Entry:
        """Build the entry (errors propagate as they are), commit it with whoever else is
        sending, and return it; raises the commit's error for this entry."""
        with self._cond:
            self._refuse_if_closing()
            self._arriving += 1
        try:
            entry = build()
        except BaseException:
            with self._cond:
                self._arriving -= 1
                self._wake_lingering_leader()
                if self._closing:
                    self._cond.notify_all()
            raise
        waiter = _Waiter(entry)
        with self._cond:
            self._arriving -= 1
            self._queue.append(waiter)
            lead = not self._leading
            self._leading = True
            self._wake_lingering_leader()
        if not lead:
            waiter.wait()
            lead = waiter.promoted
        if lead:
            self._lead(waiter)
        if waiter.error is not None:
            raise waiter.error
        return entry

    def close(self, timeout_s: float | None = None) -> None:
        """Refuse new messages and wait (up to timeout_s) for the senders already in."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            while self._leading or self._queue or self._arriving:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    log.warning("msgbus_client: group commit still running at close()")
                    return
                self._cond.wait(left)

    def _wake_lingering_leader(self) -> None:
        if self._lingering and (self._arriving == 0 or len(self._queue) >= self._max_group):
            self._cond.notify_all()

    def _lead(self, own: _Waiter) -> None:
        """Commit groups while senders queue, up to a few: the leader already holds the GIL, so
        the next fsync starts at once instead of after a hand-off. Then the first queued
        sender takes over, so no caller is held up for long."""
        with self._cond:
            self._linger()
            group = self._take()
        for round_ in range(1, _MAX_GROUPS_PER_LEADER + 1):
            self._commit_and_release(group, own)
            with self._cond:
                if not self._queue:
                    self._leading = False
                    self._cond.notify_all()  # close() may be waiting
                    return
                if round_ == _MAX_GROUPS_PER_LEADER:
                    successor = self._queue[0]
                    successor.promoted = True
                    successor.done.release()
                    return
                group = self._take()

    def _commit_and_release(self, group: list[_Waiter], own: _Waiter) -> None:
        results = _call(self._handle, [waiter.entry for waiter in group])
        followers = [waiter for waiter in group if waiter is not own]
        for waiter, error in zip(group, results, strict=True):
            waiter.error = error
        for waiter, successor in itertools.pairwise(followers):
            waiter.next = successor
        if followers:
            # released one after the other, each by the previous one, so that woken threads
            # do not pile up on the GIL
            followers[0].done.release()

    def _linger(self) -> None:
        """Wait up to the window for senders already on their way (caller holds the lock)."""
        if self._window_s <= 0 or self._arriving == 0:
            return
        deadline = time.monotonic() + self._window_s
        self._lingering = True
        try:
            while self._arriving > 0 and len(self._queue) < self._max_group:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)
        finally:
            self._lingering = False


def _call(handle: Callable[[list[Entry]], GroupResult], entries: list[Entry]) -> GroupResult:
    try:
        return handle(entries)
    except BaseException as exc:  # hand the failure to every sender of the group
        return _failed(exc, len(entries))


class AsyncGroupCommitter(_CommitQueue[tuple[Entry, asyncio.Future[None]]]):
    """asyncio flavour; `await submit(entry)`. Must be used from one event loop."""

    def __init__(
        self, handle: Callable[[list[Entry]], Awaitable[GroupResult]], *, max_group: int
    ) -> None:
        super().__init__(max_group)
        self._handle = handle
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="msgbus-client-group-commit")

    async def submit(self, entry: Entry) -> None:
        self._refuse_if_closing()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((entry, future))
        self._wake.set()
        await future

    async def close(self, timeout_s: float | None = None) -> None:
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for _, future in self._queue:
            if not future.done():
                future.set_exception(ClientClosedError("the client closed before the commit"))
        self._queue.clear()

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            await asyncio.sleep(0)  # let senders that are ready to run join this group
            group = [item for item in self._take() if not item[1].done()]
            if not group:
                continue  # every sender in it was cancelled before its message was written
            try:
                results = await self._handle([entry for entry, _ in group])
            except asyncio.CancelledError:
                for _, future in group:
                    if not future.done():
                        future.set_exception(ClientClosedError("the client closed mid-commit"))
                raise
            except Exception as exc:
                results = _failed(exc, len(group))
            for (_, future), error in zip(group, results, strict=True):
                if future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
