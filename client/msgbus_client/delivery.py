"""Deliver spooled entries: POST them, then settle the outcome in the spool in one transaction
(delete what was acknowledged, move what was rejected) and report to `ReceiverHealth`.

`Deliverer` (threads) and `AsyncDeliverer` (asyncio) do the same; only the I/O differs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from msgbus_client import metrics
from msgbus_client.message import Entry
from msgbus_client.metrics import ClientCounters
from msgbus_client.protocol import (
    Outcome,
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


def inline_allowed(settings: ClientSettings, backlog: Backlog, health: ReceiverHealth) -> bool:
    """Whether send() may POST a fresh message itself: inline sends are on, no older message
    waits for the resender (it would be overtaken), and the receiver is not failing."""
    return settings.inline_send and not backlog and not health.backing_off()


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


def _fallback_result(entries: Sequence[Entry], done: Outcome, start: int) -> Outcome:
    """After a failed single send during batch fallback, keep the untried rest for later."""
    done.retry.extend(entries[start:])
    return done


class Deliverer:
    def __init__(
        self,
        spool: Spool,
        sender: HttpSender,
        health: ReceiverHealth,
        counters: ClientCounters | None = None,
    ) -> None:
        self._spool = spool
        self._sender = sender
        self._health = health
        self._counters = counters or ClientCounters()

    def deliver(
        self, entries: Sequence[Entry], timeout_s: float | None = None, *, resend: bool = False
    ) -> Outcome:
        """POST `entries` (single endpoint for one, batch endpoint for several) and settle.
        `resend`: the resender is sending (for the counters)."""
        outcome = self._post(entries, timeout_s)
        self._spool.settle(outcome.acked, outcome.rejected)
        _count(self._counters, entries, outcome, resend)
        _report(outcome, self._health)
        return outcome

    def _post(self, entries: Sequence[Entry], timeout_s: float | None) -> Outcome:
        if len(entries) == 1:
            return self._post_single(entries[0], timeout_s)
        outcome = interpret_batch(entries, self._sender.post(batch_request(entries), timeout_s))
        if not outcome.fallback_single:
            return outcome
        log.info("msgbus_client: %s; sending its messages one by one", outcome.reason)
        merged = Outcome()
        for index, entry in enumerate(entries):
            single = self._post_single(entry, timeout_s)
            merged.merge(single)
            if single.retry:
                return _fallback_result(entries, merged, index + 1)
        return merged

    def _post_single(self, entry: Entry, timeout_s: float | None) -> Outcome:
        return interpret_single(entry, self._sender.post(single_request(entry), timeout_s))


class AsyncDeliverer:
    def __init__(
        self,
        spool: Spool,
        sender: AsyncHttpSender,
        health: ReceiverHealth,
        counters: ClientCounters | None = None,
    ) -> None:
        self._spool = spool
        self._sender = sender
        self._health = health
        self._counters = counters or ClientCounters()

    async def deliver(
        self, entries: Sequence[Entry], timeout_s: float | None = None, *, resend: bool = False
    ) -> Outcome:
        outcome = await self._post(entries, timeout_s)
        await asyncio.to_thread(self._spool.settle, outcome.acked, outcome.rejected)
        _count(self._counters, entries, outcome, resend)
        _report(outcome, self._health)
        return outcome

    async def _post(self, entries: Sequence[Entry], timeout_s: float | None) -> Outcome:
        if len(entries) == 1:
            return await self._post_single(entries[0], timeout_s)
        result = await self._sender.post(batch_request(entries), timeout_s)
        outcome = interpret_batch(entries, result)
        if not outcome.fallback_single:
            return outcome
        log.info("msgbus_client: %s; sending its messages one by one", outcome.reason)
        merged = Outcome()
        for index, entry in enumerate(entries):
            single = await self._post_single(entry, timeout_s)
            merged.merge(single)
            if single.retry:
                return _fallback_result(entries, merged, index + 1)
        return merged

    async def _post_single(self, entry: Entry, timeout_s: float | None) -> Outcome:
        return interpret_single(entry, await self._sender.post(single_request(entry), timeout_s))


def open_spool_and_sender(
    settings: ClientSettings, api_key: str, make_sender: Callable[[], SenderT]
) -> tuple[Spool, SenderT, ReceiverHealth]:
    """The parts both clients start from. The spool is closed again if the sender fails."""
    if not api_key:
        raise ValueError("api_key must not be empty")
    if settings.spool_root is not None:
        spool = Spool.open_slot(
            settings.spool_root,
            max_slots=settings.max_slots,
            max_spool_bytes=settings.max_spool_bytes,
        )
    else:
        assert settings.spool_dir is not None  # ClientSettings checks that one is given
        spool = Spool(settings.spool_dir, max_spool_bytes=settings.max_spool_bytes)
    try:
        sender = make_sender()
    except BaseException:
        spool.close()
        raise
    health = ReceiverHealth(
        base_s=settings.retry_base_s,
        max_s=settings.retry_max_s,
        max_retry_after_s=settings.max_retry_after_s,
    )
    return spool, sender, health


def group_results(
    spool: Spool, entries: Sequence[Entry], refused: Sequence[Entry]
) -> list[BaseException | None]:
    """Each sender's result after a group commit: None, or a spool-full error for the entries
    the spool refused for lack of space."""
    if not refused:
        return [None] * len(entries)
    refused_keys = {e.key for e in refused}
    return [spool.full_error(e) if e.key in refused_keys else None for e in entries]
