"""`BrokerConsumers`: a subscription worker's consumers, one per broker cluster it reads, each
with a loop of its own. A loop takes batches from its consumer, acks at once the messages that
were delivered already (redeliveries) or that the subscription does not receive, and admits the
others with an ack that is counted until called: a consumer being retired (a drained broker)
waits for those acks before it closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from dispatcher.outcomes import Ack
from dispatcher.redelivery import DeliveredCheck
from msgbus.backoff import backoff_s
from msgbus.brokers.base import Received, SubscriptionConsumer
from msgbus.delivery.filters import subscription_receives
from msgbus.models import Envelope, Subscription
from msgbus.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RECEIVE_BATCH = 256
# A delivery (or the consumer's close) ends a receive's wait at once, so the wait bounds only how
# often an idle consumer's loop wakes up: 0.5 s made a hundred idle subscriptions two hundred
# wake-ups a second (bench.scale)
RECEIVE_WAIT_S = 30.0
START_RETRY_FIRST_S, START_RETRY_MAX_S = 1.0, 10.0  # a consumer that cannot start

Admit = Callable[[Envelope, Ack | None], Awaitable[None]]
Checked = asyncio.Queue[tuple[list[Received], set[str]]]  # a batch, and its delivered ids


class BrokerConsumers:
    def __init__(self, subscription: Subscription, consumers: list[SubscriptionConsumer],
                 delivered: DeliveredCheck, *, admit: Admit) -> None:
        self._sub = subscription
        self._consumers = consumers
        self._delivered = delivered
        self._admit = admit
        self._loops: dict[int, asyncio.Task[None]] = {}  # by id() of the consumer
        self._unacked: dict[int, int] = {}  # admitted, not yet acked, by id() of the consumer
        self._acked = asyncio.Event()  # set by every counted ack

    @property
    def consumers(self) -> list[SubscriptionConsumer]:
        return list(self._consumers)

    @property
    def paused_partitions(self) -> int:
        return sum(consumer.paused_partitions for consumer in self._consumers)

    @property
    def loops(self) -> list[asyncio.Task[None]]:
        return list(self._loops.values())

    def start(self) -> None:
        """Never fails on a broker: a consumer that cannot connect keeps trying in its loop,
        and the others work meanwhile."""
        for consumer in self._consumers:
            self._start_consuming(consumer)

    def _start_consuming(self, consumer: SubscriptionConsumer) -> None:
        self._unacked[id(consumer)] = 0
        self._loops[id(consumer)] = asyncio.create_task(
            self._consume_loop(consumer), name=f"consume-{self._sub.id}")

    def add(self, consumers: list[SubscriptionConsumer]) -> None:
        """Consume these too (a broker to drain), beside the others."""
        self._consumers += consumers
        for consumer in consumers:
            self._start_consuming(consumer)

    async def retire(self, consumers: list[SubscriptionConsumer], grace_s: float) -> None:
        """Stop consuming these (a drained broker) without stopping the others: take no more
        from them, let what they handed out be pushed and acked (within `grace_s`), close
        them."""
        for consumer in consumers:
            await cancel_and_wait(self._loops.pop(id(consumer), None))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_acked(consumers), grace_s)
        for consumer in consumers:
            self._consumers.remove(consumer)
            self._unacked.pop(id(consumer), None)
            await consumer.close()

    async def close(self) -> None:
        """Closes every consumer; their loops must have been stopped first (`loops`)."""
        for consumer in self._consumers:
            await consumer.close()

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
                            self._sub.id, exc, delay)
                await asyncio.sleep(delay)

    async def _consume_loop(self, consumer: SubscriptionConsumer) -> None:
        """Takes batches from the broker and asks which were delivered already, one batch
        ahead of `_admit_checked`: a slow lookup (MongoDB busy writing traces) then overlaps
        the pushes of the batch before it instead of stopping them."""
        await self._start_consumer(consumer)
        checked: Checked = asyncio.Queue(maxsize=1)
        admitter = asyncio.create_task(self._admit_checked(consumer, checked),
                                       name=f"admit-{self._sub.id}")
        try:
            while True:
                try:
                    batch = await consumer.receive(RECEIVE_BATCH, RECEIVE_WAIT_S)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: receive failed; retrying", self._sub.id)
                    await asyncio.sleep(1.0)
                    continue
                if batch:
                    done = await self._delivered.already_delivered(
                        self._sub.id, [r.envelope for r in batch])
                    await checked.put((batch, done))
        finally:
            # batches not admitted yet stay unacked: the broker hands them out again
            await cancel_and_wait(admitter)

    async def _admit_checked(self, consumer: SubscriptionConsumer, checked: Checked) -> None:
        while True:
            batch, done = await checked.get()
            try:
                for received in batch:
                    if received.envelope.message_id in done or not subscription_receives(
                            self._sub, received.envelope):
                        consumer.ack(received)
                        continue
                    await self._admit(received.envelope, self._counted_ack(consumer, received))
            except Exception:  # never die silently: the consume loop would wait forever
                log.exception("%s: admitting a batch failed; its rest stays unacked",
                              self._sub.id)

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
