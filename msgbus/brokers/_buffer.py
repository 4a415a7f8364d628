"""What the threaded broker consumers share: a thread-to-asyncio hand-over buffer and the
consumer thread's start and stop.

A consumer thread `put`s received messages; the event loop takes them with `get`. The deque is
guarded by a lock; the loop is woken through `call_soon_threadsafe`, never by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

from msgbus.brokers.base import Received, SubscriptionConsumer
from msgbus.models import Subscription

TokenT = TypeVar("TokenT")


class ReceiveBuffer:
    def __init__(self) -> None:
        self._items: deque[Received] = deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._closed = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach the event loop that calls `get` (must be called from that loop)."""
        self._loop = loop
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, items: Iterable[Received]) -> None:
        """Append messages (any thread) and wake a waiting `get`."""
        with self._lock:
            before = len(self._items)
            self._items.extend(items)
            added = len(self._items) > before
        if added:
            self._wake()

    def drop(self, predicate: Callable[[Received], bool]) -> list[Received]:
        """Remove buffered messages matching `predicate` (any thread); returns them."""
        with self._lock:
            dropped = [r for r in self._items if predicate(r)]
            if dropped:
                self._items = deque(r for r in self._items if not predicate(r))
        return dropped

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _take(self, max_messages: int) -> list[Received]:
        with self._lock:
            count = min(max_messages, len(self._items))
            return [self._items.popleft() for _ in range(count)]

    def _wake(self) -> None:
        loop, ready = self._loop, self._ready
        if loop is None or ready is None:
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(ready.set)

    async def get(self, max_messages: int, timeout_s: float) -> list[Received]:
        """Up to `max_messages`, waiting at most `timeout_s` for the first one."""
        if self._ready is None:
            raise RuntimeError("ReceiveBuffer.get before bind()")
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            items = self._take(max_messages)
            if items or self._closed:
                return items
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._ready.clear()
            if len(self) or self._closed:  # a put raced with clear(): take it now
                continue
            try:
                await asyncio.wait_for(self._ready.wait(), remaining)
            except TimeoutError:
                return self._take(max_messages)


class BufferedConsumer(SubscriptionConsumer):
    """A consumer whose broker client runs on a thread (confluent-kafka, pika) and hands what it
    receives over through `_buffer`, which the event loop reads."""

    def __init__(self, subscription: Subscription, *, max_buffered: int) -> None:
        super().__init__(subscription, max_buffered=max_buffered)
        self._buffer = ReceiveBuffer()

    def _bind_buffer(self) -> None:
        """Called on the event loop that will `receive`."""
        self._buffer.bind(asyncio.get_running_loop())

    async def receive(self, max_messages: int, timeout_s: float) -> list[Received]:
        return await self._buffer.get(max_messages, timeout_s)

    def _token(self, received: Received, kind: type[TokenT]) -> TokenT:
        """The ack token this consumer gave `received`; a TypeError for another's."""
        if not isinstance(received.token, kind):
            raise TypeError(f"not a {self.kind.value} ack token: {received.token!r}")
        return received.token

    @property
    def buffered(self) -> int:
        return len(self._buffer)


class ThreadedConsumer(BufferedConsumer):
    """A `BufferedConsumer` on a daemon thread of its own, which stops when `_stop` is set."""

    def __init__(self, subscription: Subscription, *, max_buffered: int) -> None:
        super().__init__(subscription, max_buffered=max_buffered)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _start_thread(self, name: str, run: Callable[[], None]) -> None:
        """Called on the event loop that will `receive`."""
        self._bind_buffer()
        self._stop.clear()
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        await asyncio.to_thread(thread.join)
        self._buffer.close()
