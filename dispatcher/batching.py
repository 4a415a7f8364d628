"""`BatchCollector`: a batch subscription's way from admission to the subscriber. It gathers
the worker's admitted messages until a batch is full (`batch_max_messages`, `batch_max_bytes`)
or its oldest message has waited `batch_max_wait_ms`, then takes a slot of the subscription's
limiter (one slot per batch, so `max_concurrency` counts batch pushes) and pushes the batch in a
task of its own. Each message's outcome is recorded (with the batch id), then acked.

While it waits for a slot, the next batch keeps growing: under load batches are full, idle they
go after the wait.

Order per biz_id (ordered subscriptions): a key whose messages are in a batch being pushed is
*busy*; its later messages stay here until that batch succeeded or they were parked. A batch
may hold several messages of one key, in order. A failed batch of an ordered subscription is
retried in place (its keys stay busy), like a single message in the worker's lanes; messages
without a biz_id that share its batch wait with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dispatcher.context import PushContext
from msgbus.delivery.attempt import outcome_of, push_batch_through
from msgbus.delivery.batch import BatchBuilder, BatchPush, estimated_size
from msgbus.models import DeliveryOutcome, Envelope, Subscription, utcnow

Ack = Callable[[], None]


@dataclass(slots=True)
class Gathered:
    envelope: Envelope
    ack: Ack | None
    key: str | None  # the biz_id whose order it keeps (ordered subscriptions), else None
    size: int  # estimated bytes in a batch body
    admitted_at: float  # time.monotonic()


class BatchCollector:
    def __init__(self, context: PushContext,
                 record: Callable[[list[DeliveryOutcome]], Awaitable[None]]) -> None:
        """`record`: where the outcomes of each batch push go."""
        subscription = context.subscription
        self._sub, self._limiter, self._sender = subscription, context.limiter, context.sender
        self._track, self._closing = context.track, context.closing
        self._record = record
        self._max_messages = subscription.batch_max_messages or 1
        self._max_wait_s = subscription.batch_max_wait_ms / 1000
        self._capacity = max(subscription.in_flight_budget, self._max_messages)
        self._gathered: deque[Gathered] = deque()
        self._busy: set[str] = set()  # keys with a batch being pushed
        self._ready_count = 0  # gathered messages a batch may take now, their bytes, and
        self._ready_bytes = 0  # when the oldest of them was admitted
        self._oldest_ready_at: float | None = None
        self._changed = asyncio.Event()
        self._room = asyncio.Event()

    async def add(self, envelope: Envelope, ack: Ack | None) -> None:
        """Waits while `in_flight_budget` messages are gathered (the consumer reads no faster
        than batches go)."""
        while len(self._gathered) >= self._capacity:
            self._room.clear()
            await self._room.wait()
        key = envelope.biz_id if self._sub.ordered_by_biz_id else None
        item = Gathered(envelope, ack, key, estimated_size(envelope), time.monotonic())
        self._gathered.append(item)
        if key is None or key not in self._busy:
            self._count_ready(item)
        self._changed.set()

    async def run(self) -> None:
        """The collector's loop (a task of the worker's): one batch after the other."""
        while not self._closing.is_set():
            await self._until_batch_due()
            if not await self._limiter.acquire(self._closing):
                return
            batch, acks = self._take()
            if not len(batch):
                self._limiter.release(None)
                continue
            self._track(self._deliver(batch, acks))

    def _count_ready(self, item: Gathered) -> None:
        self._ready_count += 1
        self._ready_bytes += item.size
        if self._oldest_ready_at is None:
            self._oldest_ready_at = item.admitted_at

    def _recount(self) -> None:
        """After keys became busy or free: what a batch may take now (one pass, only where
        keys are kept: unordered, everything gathered is ready)."""
        if not self._sub.ordered_by_biz_id:
            self._oldest_ready_at = self._gathered[0].admitted_at if self._gathered else None
            return
        self._ready_count = self._ready_bytes = 0
        self._oldest_ready_at = None
        for item in self._gathered:
            if item.key is None or item.key not in self._busy:
                self._count_ready(item)

    async def _until_batch_due(self) -> None:
        """Until the messages a batch may take fill one, or the oldest has waited enough."""
        while True:
            if (self._ready_count >= self._max_messages
                    or self._ready_bytes >= self._sub.batch_max_bytes):
                return
            timeout: float | None = None
            if self._oldest_ready_at is not None:
                timeout = self._oldest_ready_at + self._max_wait_s - time.monotonic()
                if timeout <= 0:
                    return
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return

    def _take(self) -> tuple[BatchPush, list[Ack | None]]:
        """The next batch, in admission order: messages of busy keys stay; the first one that
        does not fit ends it."""
        builder = BatchBuilder(self._sub)
        acks: list[Ack | None] = []
        keys: set[str] = set()
        kept: deque[Gathered] = deque()
        while self._gathered:
            item = self._gathered[0]
            if item.key is not None and item.key in self._busy:
                kept.append(self._gathered.popleft())
                continue
            if not builder.add(item.envelope, 1):
                break
            self._gathered.popleft()
            self._ready_count -= 1
            self._ready_bytes -= item.size
            acks.append(item.ack)
            if item.key is not None:
                keys.add(item.key)
        kept.extend(self._gathered)
        self._gathered = kept
        self._busy |= keys
        self._recount()
        self._room.set()
        return builder.batch, acks

    async def _deliver(self, batch: BatchPush, acks: list[Ack | None]) -> None:
        """Called with a slot acquired. Unordered: one push, every outcome recorded, then the
        acks (failures go to the compensator's retries). Ordered: retried in place until each
        message succeeded or was parked."""
        keys = {e.biz_id for e in batch.envelopes if e.biz_id is not None}
        try:
            if self._sub.ordered_by_biz_id:
                await self._deliver_in_order(batch, acks)
            else:
                outcomes = await self._push(batch, retry_in_place=False)
                await self._record(outcomes)
                _ack_all(acks)
        finally:
            self._busy -= keys
            self._recount()
            self._changed.set()

    async def _push(self, batch: BatchPush, *, retry_in_place: bool) -> list[DeliveryOutcome]:
        results = await push_batch_through(self._limiter, self._sender, batch, self._sub)
        return [outcome_of(result, envelope, self._sub, attempts_so_far=attempt,
                           retry_in_place=retry_in_place)
                for result, envelope, attempt
                in zip(results, batch.envelopes, batch.attempts, strict=True)]

    async def _deliver_in_order(self, batch: BatchPush, acks: list[Ack | None]) -> None:
        while True:
            outcomes = await self._push(batch, retry_in_place=True)
            await self._record(outcomes)
            again = [i for i, o in enumerate(outcomes) if o.retrying_in_place]
            _ack_all([ack for ack, o in zip(acks, outcomes, strict=True)
                      if not o.retrying_in_place])
            if not again:
                return
            due = max(o.next_attempt_at or utcnow() for o in outcomes if o.retrying_in_place)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(),
                                       max(0.0, (due - utcnow()).total_seconds()))
            if self._closing.is_set() or not await self._limiter.acquire(self._closing):
                return  # not acked: the broker hands them to the next worker
            batch, acks = _again(batch, again, self._sub), [acks[i] for i in again]


def _again(batch: BatchPush, indexes: list[int], sub: Subscription) -> BatchPush:
    """The messages at `indexes` as a new batch, each at its next attempt."""
    builder = BatchBuilder(sub)
    for i in indexes:
        builder.add(batch.envelopes[i], batch.attempts[i] + 1, force=True)
    return builder.batch


def _ack_all(acks: list[Ack | None]) -> None:
    for ack in acks:
        if ack is not None:
            ack()
