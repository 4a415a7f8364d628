"""`SubscriptionWorker`: everything one subscription needs, isolated from the others — its own
consumers (one per broker cluster it reads), direct-path queue, concurrency limit (semaphore)
and in-flight tasks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from msgbus.brokers.base import SubscriptionConsumer
from msgbus.delivery.breaker import CircuitBreaker
from msgbus.delivery.filters import matches
from msgbus.delivery.retry import decide_retry
from msgbus.delivery.sender import Sender
from msgbus.delivery.trace import TraceWriter
from msgbus.metrics import CIRCUIT_OPEN, IN_FLIGHT, PUSH_LATENCY, PUSHES, SKIPPED, SLOT_WAIT
from msgbus.models import AttemptResult, DeliveryOutcome, Envelope, Subscription, utcnow

log = logging.getLogger(__name__)

RECEIVE_BATCH = 256
RECEIVE_WAIT_S = 0.5
_START_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)

Ack = Callable[[], None]


def is_for(subscription: Subscription, envelope: Envelope) -> bool:
    """A subscription gets the messages accepted after it was created, not the history."""
    accepted = envelope.received_at or envelope.created_at
    return accepted >= subscription.created_at


class SubscriptionWorker:
    def __init__(
        self, subscription: Subscription, consumers: list[SubscriptionConsumer],
        sender: Sender, trace: TraceWriter, *, direct_queue_size: int,
    ) -> None:
        self.subscription = subscription
        self._consumers = consumers
        self._sender = sender
        self._trace = trace
        self._limit = asyncio.Semaphore(subscription.max_concurrency)
        self._direct: asyncio.Queue[Envelope] = asyncio.Queue(maxsize=direct_queue_size)
        self._loops: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        # ordered subscriptions: per biz_id, the messages waiting for the one being delivered
        self._lanes: dict[str, deque[tuple[Envelope, Ack | None]]] = {}
        self._closing = asyncio.Event()  # ends in-place retry waits at once
        self._gauge = IN_FLIGHT.labels(subscription.id)
        self._slot_wait = SLOT_WAIT.labels(subscription.id)
        self._latency = PUSH_LATENCY.labels(subscription.id)
        self._breaker = CircuitBreaker(subscription.id)
        self._circuit_gauge = CIRCUIT_OPEN.labels(subscription.id)

    async def start(self) -> None:
        """Never fails on a broker: a consumer that cannot connect keeps trying in its loop,
        and the others (and the direct path) work meanwhile."""
        for consumer in self._consumers:
            self._loops.append(asyncio.create_task(self._consume_loop(consumer),
                                                   name=f"consume-{self.subscription.id}"))
        self._loops.append(asyncio.create_task(self._direct_loop(),
                                               name=f"direct-{self.subscription.id}"))

    @property
    def consumers(self) -> list[SubscriptionConsumer]:
        return list(self._consumers)

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
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._in_flight:
            _, pending = await asyncio.wait(self._in_flight, timeout=grace_s)
            for task in pending:
                task.cancel()
        for consumer in self._consumers:
            await consumer.close()
        if not self._direct.empty():
            log.warning("%s: %d direct messages not pushed at close; they stay pending for "
                        "the compensator", self.subscription.id, self._direct.qsize())

    async def _start_consumer(self, consumer: SubscriptionConsumer) -> None:
        failures = 0
        while True:
            try:
                await consumer.start()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = _START_BACKOFF_S[min(failures, len(_START_BACKOFF_S) - 1)]
                failures += 1
                log.warning("%s: consumer cannot start (%s); retrying in %.0fs",
                            self.subscription.id, exc, delay)
                await asyncio.sleep(delay)

    async def _consume_loop(self, consumer: SubscriptionConsumer) -> None:
        await self._start_consumer(consumer)
        while True:
            try:
                batch = await consumer.receive(RECEIVE_BATCH, RECEIVE_WAIT_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: receive failed; retrying", self.subscription.id)
                await asyncio.sleep(1.0)
                continue
            for received in batch:
                if not is_for(self.subscription, received.envelope):
                    consumer.ack(received)
                    continue
                await self._admit(received.envelope, functools.partial(consumer.ack, received))

    async def _direct_loop(self) -> None:
        while True:
            envelope = await self._direct.get()
            await self._admit(envelope, None)

    async def _admit(self, envelope: Envelope, ack: Ack | None) -> None:
        """Start the message's way to the subscriber. Waits for a concurrency slot (so the
        consumer reads no faster than the subscriber takes), except for an ordered one, which
        waits in its key's lane instead."""
        if not matches(self.subscription, envelope):
            self._track(self._skip(envelope, ack))
        elif self.subscription.ordered_by_biz_id and envelope.biz_id is not None:
            self._enqueue_in_lane(envelope.biz_id, envelope, ack)
        else:
            await self._acquire_slot()
            self._track(self._deliver(envelope, ack))

    def _track(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _acquire_slot(self) -> None:
        started = time.perf_counter()
        await self._breaker.admit()
        await self._limit.acquire()
        self._slot_wait.observe(time.perf_counter() - started)
        self._gauge.inc()

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
                await self._acquire_slot()
                await self._deliver(envelope, ack, retry_in_place=True)
                lane.popleft()
        finally:
            del self._lanes[key]

    async def _push(self, envelope: Envelope, attempt: int) -> AttemptResult:
        """Called with a slot acquired; frees it when the subscriber has answered."""
        try:
            result = await self._sender.push(envelope, self.subscription, attempt=attempt)
            self._breaker.record(result)
            self._circuit_gauge.set(self._breaker.is_open)
            return result
        finally:
            # The semaphore limits the subscriber's load, not our bookkeeping: recording the
            # outcome (an fsync) happens after the slot is free. The broker's unacked window
            # still bounds how many messages are between push and ack.
            self._limit.release()
            self._gauge.dec()

    async def _deliver(self, envelope: Envelope, ack: Ack | None, *,
                       retry_in_place: bool = False) -> None:
        """Called with a slot acquired. Without `retry_in_place` a failure is recorded for the
        compensator; with it (ordered subscriptions) the message is pushed again here, after
        the policy's delay, until it succeeds or the policy parks it."""
        sub = self.subscription
        attempt = 1
        while True:
            result = await self._push(envelope, attempt)
            outcome = DeliveryOutcome(result=result, destination=envelope.destination,
                                      created_at=envelope.created_at, biz_id=envelope.biz_id)
            if not result.ok:
                decision = decide_retry(sub.retry_policy, result, attempts_so_far=attempt,
                                        first_created_at=envelope.created_at, now=utcnow())
                outcome.parked, outcome.next_attempt_at = decision.park, decision.next_attempt_at
                outcome.retrying_in_place = retry_in_place and not decision.park
            label = "delivered" if result.ok else "parked" if outcome.parked else "failed"
            PUSHES.labels(sub.id, label).inc()
            self._latency.observe(result.latency_ms / 1000)
            await self._record(outcome)
            if not outcome.retrying_in_place or outcome.next_attempt_at is None:
                break
            delay = (outcome.next_attempt_at - utcnow()).total_seconds()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), max(0.0, delay))
            if self._closing.is_set():
                return  # not acked: the broker hands it to the next worker
            attempt += 1
            await self._acquire_slot()
        if ack is not None:
            ack()

    async def _skip(self, envelope: Envelope, ack: Ack | None) -> None:
        """Filtered out: recorded as skipped (not lost, not retried), then acked."""
        SKIPPED.labels(self.subscription.id).inc()
        result = AttemptResult(
            message_id=envelope.message_id, subscription=self.subscription.id, attempt=0,
            started_at=utcnow(), latency_ms=0.0, error="filtered out by the subscription",
            instance=self._sender.instance)
        await self._record(DeliveryOutcome(
            result=result, destination=envelope.destination, created_at=envelope.created_at,
            biz_id=envelope.biz_id, skipped=True))
        if ack is not None:
            ack()

    async def _record(self, outcome: DeliveryOutcome) -> None:
        """The broker is acked only once the outcome is durable: retried until it is."""
        while True:
            try:
                await self._trace.record(outcome)
                return
            except Exception:
                log.exception("%s: recording an outcome failed; retrying",
                              self.subscription.id)
                await asyncio.sleep(1.0)
