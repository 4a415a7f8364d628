"""Deliver spooled entries: POST them, then settle the outcome in the spool in one transaction
(delete what was acknowledged, move what was rejected) and report to `ReceiverHealth`.

`Exchange` decides which requests to make and what their answers mean; `Deliverer` (threads)
and `AsyncDeliverer` (asyncio) only carry them, blocking or awaiting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Generic, TypeVar

from msgbus_client import metrics
from msgbus_client.message import Entry
from msgbus_client.metrics import ClientCounters
from msgbus_client.protocol import (
    Outcome,
    PostResult,
    PreparedRequest,
    batch_request,
    interpret_batch,
    interpret_single,
    single_request,
)
from msgbus_client.retry import ReceiverHealth
from msgbus_client.spool import Spool
from msgbus_client.transport import AsyncHttpSender, HttpSender

if TYPE_CHECKING:
    from msgbus_client.settings import ClientSettings

SenderT = TypeVar("SenderT", HttpSender, AsyncHttpSender)

log = logging.getLogger("msgbus_client")


class InFlight:
    """Keys of fresh messages a send() is delivering right now; the resender skips them.

    It is a live container: `Spool.oldest(skip=in_flight)` asks about each key while it walks
    its read transaction, i.e. after the spool was read. A message whose inline attempt ends in
    between is then sent by the resender too (at worst twice); asking before reading could skip
    it yet take a message sent after it, breaking send order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[bytes] = set()

    def add(self, key: bytes) -> None:
        with self._lock:
            self._keys.add(key)

    def discard(self, keys: Iterable[bytes]) -> None:
        with self._lock:
            self._keys.difference_update(keys)

    @contextmanager
    def holding(self, key: bytes) -> Iterator[None]:
        """`key` is in flight for the duration of the block."""
        self.add(key)
        try:
            yield
        finally:
            self.discard([key])

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys


class Backlog:
    """Whether messages wait in the spool for the resender. While they do, send() leaves new
    messages to the resender too (which sends oldest first), so that a message sent later is
    never first delivered before one sent earlier. Thread-safe.

    `mark()` bumps a generation; the resender clears the flag only if no mark() happened since
    it looked at the spool and found it empty, so a failure racing with that look is not lost.
    """

    def __init__(self, present: bool) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._present = present

    def mark(self) -> None:
        with self._lock:
            self._generation += 1
            self._present = True

    def generation(self) -> int:
        with self._lock:
            return self._generation

    def clear_unless_marked_since(self, generation: int) -> None:
        with self._lock:
            if self._generation == generation:
                self._present = False

    def __bool__(self) -> bool:
        return self._present


def _count(counters: ClientCounters, entries: Sequence[Entry], outcome: Outcome,
           resend: bool) -> None:
    if resend:
        counters.add(metrics.RESEND_REQUESTS)
        counters.add(metrics.RESENT_MESSAGES, len(entries))
    else:
        counters.add(metrics.INLINE_REQUESTS)
    counters.add(metrics.ACKED, len(outcome.acked))
    counters.add(metrics.REJECTED, len(outcome.rejected))
    if outcome.retry:
        counters.add(metrics.FAILED_REQUESTS)


def _report(outcome: Outcome, health: ReceiverHealth) -> None:
    for entry, status, error in outcome.rejected:
        log.error(
            "msgbus_client: receiver rejected message %s to %r with HTTP %d: %s; "
            "moved to the spool's rejected list",
            entry.message_id,
            entry.destination,
            status,
            error,
        )
    if outcome.retry:
        first = health.failures == 0
        delay = health.record_failure(outcome.retry_after_s)
        level = logging.WARNING if first else logging.DEBUG
        log.log(
            level,
            "msgbus_client: %d message(s) not delivered (%s); kept in the spool, "
            "next attempt in %.2f s",
            len(outcome.retry),
            outcome.reason,
            delay,
        )
    elif health.record_success():
        log.warning("msgbus_client: receiver reachable again")


class Exchange:
    """The POSTs that deliver some entries, decided one answer at a time, without I/O: the single
    endpoint for one entry, the batch endpoint for several, and, when the receiver refuses a
    batch as a whole, each message alone until one of them is not settled (the untried rest is
    kept for later). A deliverer POSTs `request` and hands the answer back until it is None;
    `outcome` is then the verdict on every entry."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.outcome = Outcome()
        self._steps = _exchange(entries)
        self.request: PreparedRequest | None = next(self._steps)

    def answer(self, result: PostResult) -> None:
        try:
            self.request = self._steps.send(result)
        except StopIteration as done:
            self.request, self.outcome = None, done.value


def _exchange(entries: Sequence[Entry]) -> Generator[PreparedRequest, PostResult, Outcome]:
    if len(entries) == 1:
        return interpret_single(entries[0], (yield single_request(entries[0])))
    outcome = interpret_batch(entries, (yield batch_request(entries)))
    if not outcome.fallback_single:
        return outcome
    log.info("msgbus_client: %s; sending its messages one by one", outcome.reason)
    merged = Outcome()
    for index, entry in enumerate(entries):
        single = interpret_single(entry, (yield single_request(entry)))
        merged.merge(single)
        if single.retry:
            merged.retry.extend(entries[index + 1 :])
            return merged
    return merged


class _DelivererBase(Generic[SenderT]):
    """POST entries and settle the outcome in the spool (one transaction: delete what was
    acknowledged, move what was rejected), then count and report it. The flavours only carry
    the `Exchange`'s requests and settle, blocking or awaiting."""

    sender: SenderT

    def __init__(
        self,
        spool: Spool,
        sender: SenderT,
        health: ReceiverHealth,
        counters: ClientCounters | None = None,
    ) -> None:
        self.sender = sender
        self._spool = spool
        self._health = health
        self._counters = counters or ClientCounters()

    def _settled(self, entries: Sequence[Entry], outcome: Outcome, resend: bool) -> Outcome:
        _count(self._counters, entries, outcome, resend)
        _report(outcome, self._health)
        return outcome


class Deliverer(_DelivererBase[HttpSender]):
    def deliver(
        self, entries: Sequence[Entry], timeout_s: float | None = None, *, resend: bool = False
    ) -> Outcome:
        """POST `entries` and settle them; `timeout_s` caps each request's timeout. `resend`:
        the resender is sending (for the counters)."""
        exchange = Exchange(entries)
        while exchange.request is not None:
            exchange.answer(self.sender.post(exchange.request, timeout_s))
        self._spool.settle(exchange.outcome.acked, exchange.outcome.rejected)
        return self._settled(entries, exchange.outcome, resend)


class AsyncDeliverer(_DelivererBase[AsyncHttpSender]):
    async def deliver(
        self, entries: Sequence[Entry], timeout_s: float | None = None, *, resend: bool = False
    ) -> Outcome:
        """As Deliverer.deliver(); the spool is settled in a worker thread."""
        exchange = Exchange(entries)
        while exchange.request is not None:
            exchange.answer(await self.sender.post(exchange.request, timeout_s))
        outcome = exchange.outcome
        await asyncio.to_thread(self._spool.settle, outcome.acked, outcome.rejected)
        return self._settled(entries, outcome, resend)


def open_spool(settings: ClientSettings) -> Spool:
    """The spool of `settings`: its own dir, or a free slot below a shared root."""
    if settings.spool_root is not None:
        return Spool.open_slot(
            settings.spool_root,
            max_slots=settings.max_slots,
            max_spool_bytes=settings.max_spool_bytes,
        )
    assert settings.spool_dir is not None  # ClientSettings checks that one is given
    return Spool(settings.spool_dir, max_spool_bytes=settings.max_spool_bytes)
