"""The resender: a background worker that delivers whatever stays in the spool.

It sends oldest first, in batches (`max_batch_messages`, `max_batch_bytes`), skips messages a
send() is delivering right now, and waits while `ReceiverHealth` backs off (exponential backoff
with jitter, or the receiver's Retry-After). It starts with the client, so messages left by an
earlier process (kill -9, power cut) go out first. It sleeps when the spool is empty and is woken
when a delivery fails or a rejected message is queued again. It never stops on an error: it
logs, waits and goes on.

`stop(deadline)` turns it into a flush: it keeps sending until the spool is empty or the deadline
passes, with request timeouts cut to the time left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from msgbus_client.delivery import AsyncDeliverer, Backlog, Deliverer, InFlight
from msgbus_client.errors import SpoolError
from msgbus_client.message import Entry
from msgbus_client.retry import ReceiverHealth, flush_request_timeout_s, flush_wait_s
from msgbus_client.settings import ClientSettings
from msgbus_client.spool import Spool

log = logging.getLogger("msgbus_client")

_ERROR_PAUSE_S = 1.0


class _Plan:
    """Shared decisions of both flavours: what to wait for, what to send, with what timeout."""

    def __init__(self, settings: ClientSettings, health: ReceiverHealth, backlog: Backlog) -> None:
        self.settings = settings
        self.health = health
        self.backlog = backlog
        self.deadline: float | None = None  # set by stop(): flush until then

    @property
    def flushing(self) -> bool:
        return self.deadline is not None

    def time_left(self) -> float:
        assert self.deadline is not None
        return self.deadline - time.monotonic()

    def backoff_wait(self) -> float | None:
        """Seconds to wait before the next attempt; None means give up (flush deadline)."""
        if self.deadline is None:
            return self.health.wait_s()
        return flush_wait_s(self.health, self.deadline)

    def request_timeout(self) -> float | None:
        return None if self.deadline is None else flush_request_timeout_s(self.deadline)

    def batch(self, spool: Spool, in_flight: InFlight) -> list[Entry]:
        """The next batch, oldest first; an empty spool (but for messages a send() is
        delivering itself) ends the backlog."""
        generation = self.backlog.generation()
        found = spool.oldest(
            self.settings.max_batch_messages, self.settings.max_batch_bytes, skip=in_flight
        )
        if not found:
            self.backlog.clear_unless_marked_since(generation)
        return found


class Resender:
    """Thread flavour."""

    def __init__(
        self,
        spool: Spool,
        deliverer: Deliverer,
        health: ReceiverHealth,
        in_flight: InFlight,
        backlog: Backlog,
        settings: ClientSettings,
    ) -> None:
        self._spool = spool
        self._deliverer = deliverer
        self._in_flight = in_flight
        self._plan = _Plan(settings, health, backlog)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="msgbus-client-resender", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        """Flush for up to timeout_s, then stop the thread."""
        self._plan.deadline = time.monotonic() + max(0.0, timeout_s)
        self._stop.set()
        self._wake.set()
        # an HTTP request in progress is bounded by the request timeout
        self._thread.join(max(0.0, timeout_s) + self._plan.settings.request_timeout_s + 1)
        if self._thread.is_alive():
            log.warning("msgbus_client: resender did not stop in time")

    def _run(self) -> None:
        while True:
            try:
                if not self._step():
                    return
            except SpoolError:
                if self._spool.closed:
                    return
                log.exception("msgbus_client: resender error; retrying")
                self._stop.wait(_ERROR_PAUSE_S)
            except Exception:
                log.exception("msgbus_client: resender error; retrying")
                self._stop.wait(_ERROR_PAUSE_S)

    def _step(self) -> bool:
        """One round; False when the thread should end."""
        plan = self._plan
        if plan.flushing and plan.time_left() <= 0:
            return False
        wait = plan.backoff_wait()
        if wait is None:
            return False
        if wait > 0:
            if plan.flushing:
                time.sleep(wait)  # backoff_wait() made sure it ends before the deadline
            else:
                self._stop.wait(wait)  # only stop() cuts a backoff short
            return True
        batch = plan.batch(self._spool, self._in_flight)
        if not batch:
            if plan.flushing:
                return False
            self._wake.wait(plan.settings.idle_poll_s)
            self._wake.clear()
            return True
        self._deliverer.deliver(batch, timeout_s=plan.request_timeout(), resend=True)
        return True


class AsyncResender:
    """asyncio flavour; create it inside the event loop that will run it."""

    def __init__(
        self,
        spool: Spool,
        deliverer: AsyncDeliverer,
        health: ReceiverHealth,
        in_flight: InFlight,
        backlog: Backlog,
        settings: ClientSettings,
    ) -> None:
        self._spool = spool
        self._deliverer = deliverer
        self._in_flight = in_flight
        self._plan = _Plan(settings, health, backlog)
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="msgbus-client-resender")

    def wake(self) -> None:
        """Safe to call from any thread."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop just closed
            self._loop.call_soon_threadsafe(self._wake.set)

    async def stop(self, timeout_s: float) -> None:
        self._plan.deadline = time.monotonic() + max(0.0, timeout_s)
        self._stop.set()
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), max(0.0, timeout_s) + 1)
        except TimeoutError:
            log.warning("msgbus_client: resender did not stop in time; cancelling it")
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                if not await self._step():
                    return
            except SpoolError:
                if self._spool.closed:
                    return
                log.exception("msgbus_client: resender error; retrying")
                await _wait(self._stop, _ERROR_PAUSE_S)
            except Exception:
                log.exception("msgbus_client: resender error; retrying")
                await _wait(self._stop, _ERROR_PAUSE_S)

    async def _step(self) -> bool:
        plan = self._plan
        if plan.flushing and plan.time_left() <= 0:
            return False
        wait = plan.backoff_wait()
        if wait is None:
            return False
        if wait > 0:
            if plan.flushing:
                await asyncio.sleep(wait)  # backoff_wait() made sure it ends before the deadline
            else:
                await _wait(self._stop, wait)  # only stop() cuts a backoff short
            return True
        batch = await asyncio.to_thread(plan.batch, self._spool, self._in_flight)
        if not batch:
            if plan.flushing:
                return False
            await _wait(self._wake, plan.settings.idle_poll_s)
            self._wake.clear()
            return True
        await self._deliverer.deliver(batch, timeout_s=plan.request_timeout(), resend=True)
        return True


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
