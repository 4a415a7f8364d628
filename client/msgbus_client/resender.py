"""The resender: a background worker that delivers whatever stays in the spool.

It sends oldest first, in batches (`max_batch_messages`, `max_batch_bytes`), skips messages a
send() is delivering right now, and waits while `ReceiverHealth` backs off (exponential backoff
with jitter, or the receiver's Retry-After). It starts with the client, so messages left by an
earlier process (kill -9, power cut) go out first. It sleeps when the spool is empty and is woken
when a delivery fails or a rejected message is queued again. It never stops on an error: it
logs, waits and goes on.

`stop(timeout_s)` turns it into a flush: it keeps sending until the spool is empty or `timeout_s`
has passed, with request timeouts cut to the time left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

from msgbus_client.delivery import AsyncDeliverer, Backlog, Deliverer, InFlight
from msgbus_client.errors import SpoolError
from msgbus_client.message import Entry
from msgbus_client.retry import ReceiverHealth, flush_request_timeout_s, flush_wait_s
from msgbus_client.settings import ClientSettings
from msgbus_client.spool import Spool

log = logging.getLogger("msgbus_client")

_ERROR_PAUSE_S = 1.0


@dataclass(eq=False, slots=True)
class ResendPlan:
    """Every decision of the resender, shared by both flavours: when to try again, what to send
    next and with what timeout, and whether an error ends the loop. The flavours only wait,
    read and deliver, blocking or awaiting."""

    settings: ClientSettings
    health: ReceiverHealth
    backlog: Backlog
    spool: Spool
    in_flight: InFlight
    deadline: float | None = field(default=None, init=False)  # set by flush_for()

    @property
    def flushing(self) -> bool:
        return self.deadline is not None

    def flush_for(self, timeout_s: float) -> None:
        """From now on send until the spool is empty or `timeout_s` has passed."""
        self.deadline = time.monotonic() + max(0.0, timeout_s)

    def next_wait(self) -> float | None:
        """Seconds to wait before the next attempt (0: now); None ends the loop: a flush whose
        deadline has come, or would come during the wait."""
        if self.deadline is None:
            return self.health.wait_s()
        if self.deadline <= time.monotonic():
            return None
        return flush_wait_s(self.health, self.deadline)

    def request_timeout(self) -> float | None:
        return None if self.deadline is None else flush_request_timeout_s(self.deadline)

    def batch(self) -> list[Entry]:
        """The next batch, oldest first; an empty spool (but for messages a send() is
        delivering itself) ends the backlog. Reads the spool (the async flavour runs it in a
        worker thread)."""
        generation = self.backlog.generation()
        found = self.spool.oldest(
            self.settings.max_batch_messages, self.settings.max_batch_bytes, skip=self.in_flight
        )
        if not found:
            self.backlog.clear_unless_marked_since(generation)
        return found

    def goes_on_after(self, exc: Exception) -> bool:
        """After an error in a round: False when the spool was closed under the loop (it ends);
        else the error is logged and the loop pauses, then goes on."""
        if isinstance(exc, SpoolError) and self.spool.closed:
            return False
        log.error("msgbus_client: resender error; retrying", exc_info=exc)
        return True


class Resender:
    """Thread flavour."""

    def __init__(self, plan: ResendPlan, deliverer: Deliverer) -> None:
        self._plan = plan
        self._deliverer = deliverer
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
        self._plan.flush_for(timeout_s)
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
            except Exception as exc:
                if not self._plan.goes_on_after(exc):
                    return
                self._stop.wait(_ERROR_PAUSE_S)

    def _step(self) -> bool:
        """One round; False when the thread should end."""
        plan = self._plan
        wait = plan.next_wait()
        if wait is None:
            return False
        if wait > 0:
            self._back_off(wait)
            return True
        batch = plan.batch()
        if batch:
            self._deliverer.deliver(batch, timeout_s=plan.request_timeout(), resend=True)
        elif plan.flushing:
            return False
        else:
            self._wake.wait(plan.settings.idle_poll_s)
            self._wake.clear()
        return True

    def _back_off(self, wait: float) -> None:
        if self._plan.flushing:
            time.sleep(wait)  # next_wait() made sure it ends before the deadline
        else:
            self._stop.wait(wait)  # only stop() cuts a backoff short


class AsyncResender:
    """asyncio flavour; create it inside the event loop that will run it."""

    def __init__(self, plan: ResendPlan, deliverer: AsyncDeliverer) -> None:
        self._loop = asyncio.get_running_loop()
        self._plan = plan
        self._deliverer = deliverer
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
        self._plan.flush_for(timeout_s)
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
            except Exception as exc:
                if not self._plan.goes_on_after(exc):
                    return
                await _wait(self._stop, _ERROR_PAUSE_S)

    async def _step(self) -> bool:
        plan = self._plan
        wait = plan.next_wait()
        if wait is None:
            return False
        if wait > 0:
            await self._back_off(wait)
            return True
        batch = await asyncio.to_thread(plan.batch)
        if batch:
            await self._deliverer.deliver(batch, timeout_s=plan.request_timeout(), resend=True)
        elif plan.flushing:
            return False
        else:
            await _wait(self._wake, plan.settings.idle_poll_s)
            self._wake.clear()
        return True

    async def _back_off(self, wait: float) -> None:
        if self._plan.flushing:
            await asyncio.sleep(wait)  # next_wait() made sure it ends before the deadline
        else:
            await _wait(self._stop, wait)  # only stop() cuts a backoff short


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
