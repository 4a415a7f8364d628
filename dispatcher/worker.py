"""`SubscriptionWorker`: everything one subscription needs, isolated from the others — its own
consumers (one per broker cluster it reads), direct-path queue, concurrency limit (semaphore)
and in-flight tasks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable

from msgbus.brokers.base import SubscriptionConsumer
from msgbus.delivery.retry import decide_retry
from msgbus.delivery.sender import HttpSender
from msgbus.delivery.trace import TraceWriter
from msgbus.metrics import IN_FLIGHT, PUSH_LATENCY, PUSHES
from msgbus.models import AttemptResult, DeliveryOutcome, Envelope, Subscription, utcnow

log = logging.getLogger(__name__)

RECEIVE_BATCH = 256
RECEIVE_WAIT_S = 0.5
_START_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)


def is_for(subscription: Subscription, envelope: Envelope) -> bool:
    """A subscription gets the messages accepted after it was created, not the history."""
    accepted = envelope.received_at or envelope.created_at
    return accepted >= subscription.created_at


class SubscriptionWorker:
    def __init__(
        self, subscription: Subscription, consumers: list[SubscriptionConsumer],
        sender: HttpSender, trace: TraceWriter, *, direct_queue_size: int,
    ) -> None:
        self.subscription = subscription
        self._consumers = consumers
        self._sender = sender
        self._trace = trace
        self._limit = asyncio.Semaphore(subscription.max_concurrency)
        self._direct: asyncio.Queue[Envelope] = asyncio.Queue(maxsize=direct_queue_size)
        self._loops: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._gauge = IN_FLIGHT.labels(subscription.id)

    async def start(self) -> None:
        """Never fails on a broker: a consumer that cannot connect keeps trying in its loop,
        and the others (and the direct path) work meanwhile."""
        for consumer in self._consumers:
            self._loops.append(asyncio.create_task(self._consume_loop(consumer),
                                                   name=f"consume-{self.subscription.id}"))
        self._loops.append(asyncio.create_task(self._direct_loop(),
                                               name=f"direct-{self.subscription.id}"))

    def offer_direct(self, envelope: Envelope) -> bool:
        """Queue a message handed over by the receiver; False when this worker is full."""
        try:
            self._direct.put_nowait(envelope)
            return True
        except asyncio.QueueFull:
            return False

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop taking messages, let in-flight pushes finish within `grace_s`, close."""
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
                await self._limit.acquire()
                self._spawn(received.envelope, functools.partial(consumer.ack, received))

    async def _direct_loop(self) -> None:
        while True:
            envelope = await self._direct.get()
            await self._limit.acquire()
            self._spawn(envelope, None)

    def _spawn(self, envelope: Envelope, ack: Callable[[], None] | None) -> None:
        """Called with the semaphore acquired; the task releases it when the push is done."""
        self._gauge.inc()
        task = asyncio.create_task(self._deliver(envelope, ack))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _push(self, envelope: Envelope) -> AttemptResult:
        try:
            return await self._sender.push(envelope, self.subscription, attempt=1)
        finally:
            # The semaphore limits the subscriber's load, not our bookkeeping: recording the
            # outcome (an fsync) happens after the slot is free. The broker's unacked window
            # still bounds how many messages are between push and ack.
            self._limit.release()
            self._gauge.dec()

    async def _deliver(self, envelope: Envelope, ack: Callable[[], None] | None) -> None:
        sub = self.subscription
        result = await self._push(envelope)
        PUSHES.labels(sub.id, "ok" if result.ok else "error").inc()
        PUSH_LATENCY.labels(sub.id).observe(result.latency_ms / 1000)
        outcome = DeliveryOutcome(result=result, destination=envelope.destination,
                                  created_at=envelope.created_at, biz_id=envelope.biz_id)
        if not result.ok:
            decision = decide_retry(sub.retry_policy, result, attempts_so_far=1,
                                    first_created_at=envelope.created_at, now=utcnow())
            outcome.parked, outcome.next_attempt_at = decision.park, decision.next_attempt_at
        while True:  # the broker is acked only once the outcome is durable
            try:
                await self._trace.record(outcome)
                break
            except Exception:
                log.exception("%s: recording an outcome failed; retrying", sub.id)
                await asyncio.sleep(1.0)
        if ack is not None:
            ack()

