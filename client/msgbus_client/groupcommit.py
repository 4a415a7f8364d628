"""Group commit: concurrent send()s within a short window share one fsync'd spool transaction.

A single committer (a thread, or a task for asyncio) waits `window_s` after the first message
arrives, takes everything queued (up to `max_group`), and hands the group to `handle`, which
commits it and makes one delivery attempt (one batch request); then each sender is released with
its own result (None, or the exception for its message, e.g. SpoolFullError). While a group is
being handled the next one accumulates, so groups grow with the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

from msgbus_client.errors import ClientClosedError
from msgbus_client.message import Entry

log = logging.getLogger("msgbus_client")

GroupResult = list[BaseException | None]


class GroupCommitter:
    """Thread flavour; `submit()` returns a Future that the caller waits on."""

    def __init__(
        self,
        handle: Callable[[list[Entry]], GroupResult],
        *,
        window_s: float,
        max_group: int,
    ) -> None:
        self._handle = handle
        self._window_s = window_s
        self._max_group = max_group
        self._cond = threading.Condition()
        self._queue: list[tuple[Entry, Future[None]]] = []
        self._closing = False
        self._thread = threading.Thread(
            target=self._run, name="msgbus-client-group-commit", daemon=True
        )
        self._thread.start()

    def submit(self, entry: Entry) -> Future[None]:
        future: Future[None] = Future()
        with self._cond:
            if self._closing:
                raise ClientClosedError("the client is closed")
            self._queue.append((entry, future))
            self._cond.notify()
        return future

    def close(self, timeout_s: float | None = None) -> None:
        """Commit what is queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                closing = self._closing
            if not closing:
                time.sleep(self._window_s)
            with self._cond:
                group = self._queue[: self._max_group]
                del self._queue[: self._max_group]
            _resolve(group, _call(self._handle, [entry for entry, _ in group]))


def _call(handle: Callable[[list[Entry]], GroupResult], entries: list[Entry]) -> GroupResult:
    try:
        results = handle(entries)
    except BaseException as exc:  # hand every failure to the senders; the thread lives on
        log.exception("msgbus_client: group commit failed")
        return [exc] * len(entries)
    return results


def _resolve(group: list[tuple[Entry, Future[None]]], results: GroupResult) -> None:
    for (_, future), error in zip(group, results, strict=True):
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


class AsyncGroupCommitter:
    """asyncio flavour; `await submit(entry)`. Must be used from one event loop."""

    def __init__(
        self,
        handle: Callable[[list[Entry]], Awaitable[GroupResult]],
        *,
        window_s: float,
        max_group: int,
    ) -> None:
        self._handle = handle
        self._window_s = window_s
        self._max_group = max_group
        self._queue: list[tuple[Entry, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._task = asyncio.create_task(self._run(), name="msgbus-client-group-commit")

    async def submit(self, entry: Entry) -> None:
        if self._closing:
            raise ClientClosedError("the client is closed")
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
            if not self._closing:
                await asyncio.sleep(self._window_s)
            group = [item for item in self._queue[: self._max_group] if not item[1].done()]
            del self._queue[: self._max_group]
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
                log.exception("msgbus_client: group commit failed")
                results = [exc] * len(group)
            for (_, future), error in zip(group, results, strict=True):
                if future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
