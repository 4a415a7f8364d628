"""`SubscriptionWorker`: everything one subscription needs, isolated from the others — its own
consumers (one per broker cluster it reads), direct-path queue, limiter and in-flight tasks. The
limiter (`msgbus.delivery.limiter.SubscriptionLimiter`) holds the subscription's circuit breaker
and this process's share of its concurrency cap (and rate, if it has one); the shares are
settled across every process that pushes to it (`msgbus.delivery.shares.CapShares`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

from dispatcher.batching import BatchCollector
from dispatcher.redelivery import DeliveredCheck
from dispatcher.trace import TraceWriter
from msgbus.backoff import backoff_s
from msgbus.brokers.base import Received, SubscriptionConsumer
from msgbus.delivery.attempt import outcome_of, push_through, skipped_outcome
from msgbus.delivery.filters import subscription_receives, why_not_pushed
from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.schedule import scheduled_outcome, wait_until
from msgbus.delivery.sender import Sender
from msgbus.metrics import SCHEDULED, SKIPPED
from msgbus.models import DeliveryOutcome, Envelope, Subscription, utcnow
from msgbus.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# A message due within this long waits in the worker, not in MongoDB: the compensator's scan
# interval and the trace's way to MongoDB would make it later than the wait itself. Held
# messages are unacked, so at most a quarter of the in-flight budget is held at once.
HOLD_IN_MEMORY_S = 3.0
RECEIVE_BATCH = 256
RECEIVE_WAIT_S = 0.5
START_RETRY_FIRST_S, START_RETRY_MAX_S = 1.0, 10.0  # a consumer that cannot start

Ack = Callable[[], None]


class SubscriptionWorker:
    def __init__(
        self, subscription: Subscription, consumers: list[SubscriptionConsumer],
        sender: Sender, trace: TraceWriter, delivered: DeliveredCheck, *,
        limiter: SubscriptionLimiter, direct_queue_size: int,
    ) -> None:
        self.subscription = subscription
        self._consumers = consumers
        self._sender = sender
        self._trace = trace
        self._delivered = delivered
        self._limiter = limiter
        self._direct: asyncio.Queue[Envelope] = asyncio.Queue(maxsize=direct_queue_size)
        self._loops: list[asyncio.Task[None]] = []
        self._consume_loops: dict[int, asyncio.Task[None]] = {}  # by id() of the consumer
        self._unacked: dict[int, int] = {}  # admitted, not yet acked, by id() of the consumer
        self._acked = asyncio.Event()  # set by every counted ack
        self._in_flight: set[asyncio.Task[None]] = set()
        # ordered subscriptions: per biz_id, the messages waiting for the one being delivered
        self._lanes: dict[str, deque[tuple[Envelope, Ack | None]]] = {}
        self._closing = asyncio.Event()  # ends in-place retry waits at once
        # admitted messages for the pushers; None tells a pusher to stop
        self._ready: asyncio.Queue[tuple[Envelope, Ack | None] | None] = asyncio.Queue(
            maxsize=subscription.max_concurrency)
        self._pushers: list[asyncio.Task[None]] = []
        self._to_record: list[tuple[DeliveryOutcome, Ack | None]] = []
        self._batches = self._batch_collector() if subscription.batched else None
        self._held = 0  # messages due soon, waiting in `_push_when_due`

    async def start(self) -> None:
        """Never fails on a broker: a consumer that cannot connect keeps trying in its loop,
        and the others (and the direct path) work meanwhile."""
        for consumer in self._consumers:
            self._start_consuming(consumer)
        self._loops.append(asyncio.create_task(self._direct_loop(),
                                               name=f"direct-{self.subscription.id}"))
        if self._batches is not None:
            self._loops.append(asyncio.create_task(self._batches.run(),
                                                   name=f"batch-{self.subscription.id}"))
            return
        self._pushers = [asyncio.create_task(self._pusher(), name=f"push-{self.subscription.id}")
                         for _ in range(self.subscription.max_concurrency)]

    def _batch_collector(self) -> BatchCollector:
        """A batch subscription's messages go from admission to a collector, not to pushers."""
        return BatchCollector(self.subscription, self._limiter, self._sender,
                              record=self._record_many, track=self._track,
                              closing=self._closing)

    @property
    def consumers(self) -> list[SubscriptionConsumer]:
        return list(self._consumers)

    def _start_consuming(self, consumer: SubscriptionConsumer) -> None:
        self._unacked[id(consumer)] = 0
        self._consume_loops[id(consumer)] = asyncio.create_task(
            self._consume_loop(consumer), name=f"consume-{self.subscription.id}")

    def add_consumers(self, consumers: list[SubscriptionConsumer]) -> None:
        """Consume these too (a broker to drain), beside the others."""
        self._consumers += consumers
        for consumer in consumers:
            self._start_consuming(consumer)

    async def retire_consumers(self, consumers: list[SubscriptionConsumer],
                               grace_s: float = 10.0) -> None:
        """Stop consuming these (a drained broker) without stopping the others: take no more
        from them, let what they handed out be pushed and acked (within `grace_s`), close
        them."""
        for consumer in consumers:
            await cancel_and_wait(self._consume_loops.pop(id(consumer), None))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_acked(consumers), grace_s)
        for consumer in consumers:
            self._consumers.remove(consumer)
            self._unacked.pop(id(consumer), None)
            await consumer.close()

    @property
    def paused_partitions(self) -> int:
        return sum(consumer.paused_partitions for consumer in self._consumers)

    def offer_direct(self, envelope: Envelope) -> bool:
        """Queue a message handed over by the receiver; False when this worker is full."""
        try:
            self._direct.put_nowait(envelope)
            return True
        except asyncio.QueueFull:
            return False

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop taking messages, let in-flight pushes finish within `grace_s`, close."""
        self._closing.set()
        await cancel_and_wait(*self._loops, *self._consume_loops.values())
        await self._stop_pushers(grace_s)
        if self._in_flight:
            _, pending = await asyncio.wait(self._in_flight, timeout=grace_s)
            for task in pending:
                task.cancel()
        for consumer in self._consumers:
            await consumer.close()
        if not self._direct.empty():
            log.warning("%s: %d direct messages not pushed at close; they stay pending for "
                        "the compensator", self.subscription.id, self._direct.qsize())

    async def _stop_pushers(self, grace_s: float) -> None:
        """Pushes under way finish; messages still waiting are left unacked (the broker hands
        them to the next worker, nobody got them yet)."""
        while not self._ready.empty():
            self._ready.get_nowait()
        for _ in self._pushers:
            self._ready.put_nowait(None)
        if self._pushers:
            _, pending = await asyncio.wait(self._pushers, timeout=grace_s)
            for task in pending:
                task.cancel()

    async def _start_consumer(self, consumer: SubscriptionConsumer) -> None:
        failures = 0
        while True:
            try:
                await consumer.start()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = backoff_s(failures=failures, first_s=START_RETRY_FIRST_S,
                                  max_s=START_RETRY_MAX_S)
                log.warning("%s: consumer cannot start (%s); retrying in %.0fs",
                            self.subscription.id, exc, delay)
                await asyncio.sleep(delay)

    async def _consume_loop(self, consumer: SubscriptionConsumer) -> None:
        """Takes batches from the broker and asks which were delivered already, one batch
        ahead of `_admit_checked`: a slow lookup (MongoDB busy writing traces) then overlaps
        the pushes of the batch before it instead of stopping them."""
        await self._start_consumer(consumer)
        checked: asyncio.Queue[tuple[list[Received], set[str]]] = asyncio.Queue(maxsize=1)
        admitter = asyncio.create_task(self._admit_checked(consumer, checked),
                                       name=f"admit-{self.subscription.id}")
        try:
            while True:
                try:
                    batch = await consumer.receive(RECEIVE_BATCH, RECEIVE_WAIT_S)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: receive failed; retrying", self.subscription.id)
                    await asyncio.sleep(1.0)
                    continue
                if batch:
                    done = await self._delivered.already_delivered(
                        self.subscription.id, [r.envelope for r in batch])
                    await checked.put((batch, done))
        finally:
            # batches not admitted yet stay unacked: the broker hands them out again
            await cancel_and_wait(admitter)

    async def _admit_checked(
        self, consumer: SubscriptionConsumer,
        checked: asyncio.Queue[tuple[list[Received], set[str]]],
    ) -> None:
        while True:
            batch, done = await checked.get()
            try:
                for received in batch:
                    if received.envelope.message_id in done or not subscription_receives(
                            self.subscription, received.envelope):
                        consumer.ack(received)
                        continue
                    await self._admit(received.envelope, self._counted_ack(consumer, received))
            except Exception:  # never die silently: the consume loop would wait forever
                log.exception("%s: admitting a batch failed; its rest stays unacked",
                              self.subscription.id)

    async def _all_acked(self, consumers: list[SubscriptionConsumer]) -> None:
        while any(self._unacked.get(id(c)) for c in consumers):
            self._acked.clear()
            await self._acked.wait()

    def _counted_ack(self, consumer: SubscriptionConsumer, received: Received) -> Ack:
        """The message's ack, counted until it is called (a retired consumer waits for it)."""
        key = id(consumer)
        self._unacked[key] = self._unacked.get(key, 0) + 1

        def ack() -> None:
            if key in self._unacked:
                self._unacked[key] -= 1
                self._acked.set()
            consumer.ack(received)
        return ack

    async def _direct_loop(self) -> None:
        while True:
            envelope = await self._direct.get()
            await self._admit(envelope, None)

    async def _admit(self, envelope: Envelope, ack: Ack | None) -> None:
        """Start the message's way to the subscriber. Waits for room among the pushers' ready
        messages (so the consumer reads no faster than the subscriber takes), except for an
        ordered one, which waits in its key's lane instead."""
        if (reason := why_not_pushed(self.subscription, envelope)) is not None:
            self._track(self._skip(envelope, ack, reason))
        elif (self.subscription.ordered_by_biz_id and envelope.biz_id is not None
              and self._batches is None):
            self._enqueue_in_lane(envelope.biz_id, envelope, ack)
        elif (due := wait_until(envelope, self.subscription)) is not None:
            if self._may_hold(due):
                self._track(self._push_when_due(envelope, ack, due))
            else:
                self._schedule(envelope, ack, due)
        else:
            await self._hand_on(envelope, ack)

    async def _hand_on(self, envelope: Envelope, ack: Ack | None) -> None:
        """To the batch collector (a batch subscription) or the pushers."""
        if self._batches is not None:
            await self._batches.add(envelope, ack)
        else:
            await self._ready.put((envelope, ack))

    def _may_hold(self, due: datetime) -> bool:
        return ((due - utcnow()).total_seconds() <= HOLD_IN_MEMORY_S
                and self._held < self.subscription.in_flight_budget // 4)

    async def _push_when_due(self, envelope: Envelope, ack: Ack | None,
                             due: datetime | None) -> None:
        """Due within HOLD_IN_MEMORY_S: held here, unacked (the broker hands it on if this
        process dies), then given to the pushers."""
        self._held += 1
        try:
            await self._sleep_until_due(envelope, due)
        finally:
            self._held -= 1
        if not self._closing.is_set():
            await self._hand_on(envelope, ack)

    def _schedule(self, envelope: Envelope, ack: Ack | None, due: datetime) -> None:
        """Due later: recorded as scheduled (the compensator pushes it then), then acked; the
        record is on local disk before the ack, so a kill -9 loses no delay."""
        SCHEDULED.labels(self.subscription.id).inc()
        self._collect(scheduled_outcome(envelope, self.subscription, due,
                                        self._sender.instance), ack)

    async def _pusher(self) -> None:
        """One of max_concurrency pushers: takes the next message as soon as its push is
        answered (no task per message, no wait for the consume loop), hands the outcome to a
        recording task, goes on."""
        while (item := await self._ready.get()) is not None:
            envelope, ack = item
            if not await self._limiter.acquire(self._closing):
                return  # closing: not pushed, not acked; the broker hands it on
            outcome = await self._attempt(envelope, 1, retry_in_place=False)
            self._collect(outcome, ack)

    def _collect(self, outcome: DeliveryOutcome, ack: Ack | None) -> None:
        """Records the outcome with the others of this turn of the loop, then acks."""
        if not self._to_record:
            asyncio.get_running_loop().call_soon(self._record_collected)
        self._to_record.append((outcome, ack))

    def _record_collected(self) -> None:
        """The outcomes the pushers collected in one turn of the loop: one local write, then
        their acks, in one task."""
        collected, self._to_record = self._to_record, []
        self._track(self._record_then_ack(collected))

    async def _record_then_ack(self, collected: list[tuple[DeliveryOutcome, Ack | None]]
                               ) -> None:
        await self._record_many([outcome for outcome, _ in collected])
        for _, ack in collected:
            if ack is not None:
                ack()

    def _track(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def _enqueue_in_lane(self, key: str, envelope: Envelope, ack: Ack | None) -> None:
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append((envelope, ack))
            return
        self._lanes[key] = deque([(envelope, ack)])
        self._track(self._run_lane(key))

    async def _run_lane(self, key: str) -> None:
        """Delivers one biz_id's messages one after the other, each until it succeeded or was
        parked. If the worker stops meanwhile, the unacked rest comes back from the broker."""
        lane = self._lanes[key]
        try:
            while lane and not self._closing.is_set():
                envelope, ack = lane[0]
                if not await self._wait_in_lane_until_due(envelope):
                    break
                if not await self._limiter.acquire(self._closing):
                    break
                await self._deliver_in_order(envelope, ack)
                lane.popleft()
        finally:
            del self._lanes[key]

    async def _wait_in_lane_until_due(self, envelope: Envelope) -> bool:
        """Order beats delay: a key's head that is due later is recorded as scheduled (held
        here, not by the compensator) and waited for in place, and the key's later messages
        wait behind it. False: the worker closes meanwhile (unacked: the broker hands the
        message on, and the next worker waits for it again)."""
        due = wait_until(envelope, self.subscription)
        if due is None:
            return True
        SCHEDULED.labels(self.subscription.id).inc()
        await self._record(scheduled_outcome(envelope, self.subscription, due,
                                             self._sender.instance, in_place=True))
        await self._sleep_until_due(envelope, due)
        return not self._closing.is_set()

    async def _sleep_until_due(self, envelope: Envelope, due: datetime | None) -> None:
        """Until due by the wall clock (the loop's timers may end a little early), or until
        the worker closes."""
        while due is not None and not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(),
                                       (due - utcnow()).total_seconds() + 0.001)
            due = wait_until(envelope, self.subscription)

    async def _attempt(self, envelope: Envelope, attempt: int, *,
                       retry_in_place: bool) -> DeliveryOutcome:
        """One push (called with a slot acquired) and what it means for the delivery. The
        broker's unacked window bounds how many messages are between push and ack."""
        result = await push_through(self._limiter, self._sender, envelope, self.subscription,
                                    attempt)
        return outcome_of(result, envelope, self.subscription, attempts_so_far=attempt,
                          retry_in_place=retry_in_place)

    async def _deliver_in_order(self, envelope: Envelope, ack: Ack | None) -> None:
        """Called with a slot acquired: pushes the message, and after a failure again (after
        the policy's delay) until it succeeds or the policy parks it; the next message of its
        key waits meanwhile."""
        attempt = 1
        while True:
            outcome = await self._attempt(envelope, attempt, retry_in_place=True)
            await self._record(outcome)
            if not outcome.retrying_in_place or outcome.next_attempt_at is None:
                break
            delay = (outcome.next_attempt_at - utcnow()).total_seconds()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), max(0.0, delay))
            if self._closing.is_set():
                return  # not acked: the broker hands it to the next worker
            attempt += 1
            if not await self._limiter.acquire(self._closing):
                return
        if ack is not None:
            ack()

    async def _skip(self, envelope: Envelope, ack: Ack | None, reason: str) -> None:
        """Filtered out or skipped by an operator: recorded as skipped (not lost, not
        retried), then acked."""
        SKIPPED.labels(self.subscription.id).inc()
        await self._record(skipped_outcome(envelope, self.subscription, reason,
                                           self._sender.instance))
        if ack is not None:
            ack()

    async def _record(self, outcome: DeliveryOutcome) -> None:
        await self._record_many([outcome])

    async def _record_many(self, outcomes: list[DeliveryOutcome]) -> None:
        """The broker is acked only once the outcome is durable: retried until it is."""
        while True:
            try:
                await self._trace.record(outcomes)
                self._delivered.remember((self.subscription.id, o.result.message_id)
                                         for o in outcomes if not o.retrying_in_place)
                return
            except Exception:
                log.exception("%s: recording an outcome failed; retrying",
                              self.subscription.id)
                await asyncio.sleep(1.0)
