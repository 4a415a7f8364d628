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

from msgbus_client.message import Entry
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
    """Keys of fresh messages a send() is delivering right now; the resender skips them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[bytes] = set()

    def add(self, key: bytes) -> None:
        with self._lock:
            self._keys.add(key)

    def discard(self, keys: Iterable[bytes]) -> None:
        with self._lock:
            self._keys.difference_update(keys)

    def snapshot(self) -> frozenset[bytes]:
        with self._lock:
            return frozenset(self._keys)


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
    def __init__(self, spool: Spool, sender: HttpSender, health: ReceiverHealth) -> None:
        self._spool = spool
        self._sender = sender
        self._health = health

    def deliver(self, entries: Sequence[Entry], timeout_s: float | None = None) -> Outcome:
        """POST `entries` (single endpoint for one, batch endpoint for several) and settle."""
        outcome = self._post(entries, timeout_s)
        self._spool.settle(outcome.acked, outcome.rejected)
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
    def __init__(self, spool: Spool, sender: AsyncHttpSender, health: ReceiverHealth) -> None:
        self._spool = spool
        self._sender = sender
        self._health = health

    async def deliver(self, entries: Sequence[Entry], timeout_s: float | None = None) -> Outcome:
        outcome = await self._post(entries, timeout_s)
        await asyncio.to_thread(self._spool.settle, outcome.acked, outcome.rejected)
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


def settle_group(
    spool: Spool, in_flight: InFlight, entries: Sequence[Entry], refused: Sequence[Entry]
) -> tuple[list[Entry], list[BaseException | None]]:
    """After a group commit: the entries to deliver now, and each sender's result (a
    spool-full error for the ones the spool refused, which are no longer in flight)."""
    refused_keys = {e.key for e in refused}
    if refused_keys:
        in_flight.discard(refused_keys)
    accepted = [e for e in entries if e.key not in refused_keys]
    results: list[BaseException | None] = [
        spool.full_error(e) if e.key in refused_keys else None for e in entries
    ]
    return accepted, results
