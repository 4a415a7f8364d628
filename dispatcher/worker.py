"""`SubscriptionWorker`: everything one subscription needs, isolated from the others. It admits
the messages of its broker consumers (`BrokerConsumers`, dispatcher/consuming.py) and of its
direct-path queue, and sends each its way: skipped ones to the recorder (`OutcomeRecorder`,
dispatcher/outcomes.py), an ordered subscription's to their biz_id's lane (`OrderedLanes`,
dispatcher/lanes.py), those not due yet to `DelayedMessages` (dispatcher/delays.py), the rest
to its pushers (`Pushers`, dispatcher/pushers.py) or, for a batch subscription, its
`BatchCollector` (dispatcher/batching.py).

Every push goes through the subscription's limiter (`msgbus.delivery.limiter
.SubscriptionLimiter`), which holds its circuit breaker and this process's share of its
concurrency cap (and rate, if it has one); the shares are settled across every process that
pushes to it (`msgbus.delivery.shares.CapShares`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from dispatcher.batching import BatchCollector
from dispatcher.consuming import BrokerConsumers
from dispatcher.context import PushContext
from dispatcher.delays import DelayedMessages
from dispatcher.lanes import OrderedLanes
from dispatcher.outcomes import Ack, OutcomeRecorder
from dispatcher.pushers import Pushers
from dispatcher.redelivery import DeliveredCheck
from dispatcher.trace import TraceWriter
from msgbus.brokers.base import SubscriptionConsumer
from msgbus.delivery.filters import why_not_pushed
from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.schedule import wait_until
from msgbus.delivery.sender import Sender
from msgbus.models import Envelope, Subscription
from msgbus.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class InFlight:
    """The worker's tasks that its close lets finish (within its grace): recordings, lanes,
    held messages, batch pushes."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def track(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, grace_s: float) -> None:
        """Waits for them within `grace_s`, then cancels the rest."""
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace_s)
            for task in pending:
                task.cancel()


class SubscriptionWorker:
    def __init__(
        self, subscription: Subscription, consumers: list[SubscriptionConsumer],
        sender: Sender, trace: TraceWriter, delivered: DeliveredCheck, *,
        limiter: SubscriptionLimiter, direct_queue_size: int,
    ) -> None:
        self.subscription = subscription
        self._closing = asyncio.Event()  # ends in-place waits at once
        self._in_flight = InFlight()
        track = self._in_flight.track
        self._outcomes = OutcomeRecorder(subscription, sender.instance, trace, delivered,
                                         track=track)
        self._consumers = BrokerConsumers(subscription, consumers, delivered,
                                          admit=self._admit)
        self._direct: asyncio.Queue[Envelope] = asyncio.Queue(maxsize=direct_queue_size)
        self._loops: list[asyncio.Task[None]] = []
        context = PushContext(subscription, limiter, sender, track, self._closing)
        self._delays = DelayedMessages(context, self._outcomes, self._hand_on)
        self._lanes = OrderedLanes(context, self._outcomes)
        # a batch subscription's messages go to a collector, the others' to pushers
        self._batches: BatchCollector | None = None
        self._pushers: Pushers | None = None
        if subscription.batched:
            self._batches = BatchCollector(context, self._outcomes.record)
        else:
            self._pushers = Pushers(context, self._outcomes)

    async def start(self) -> None:
        """Never fails on a broker: a consumer that cannot connect keeps trying in its loop,
        and the others (and the direct path) work meanwhile."""
        self._consumers.start()
        self._loops.append(asyncio.create_task(self._direct_loop(),
                                               name=f"direct-{self.subscription.id}"))
        if self._batches is not None:
            self._loops.append(asyncio.create_task(self._batches.run(),
                                                   name=f"batch-{self.subscription.id}"))
        if self._pushers is not None:
            self._pushers.start()

    @property
    def consumers(self) -> list[SubscriptionConsumer]:
        return self._consumers.consumers

    def add_consumers(self, consumers: list[SubscriptionConsumer]) -> None:
        """Consume these too (a broker to drain), beside the others."""
        self._consumers.add(consumers)

    async def retire_consumers(self, consumers: list[SubscriptionConsumer],
                               grace_s: float = 10.0) -> None:
        """Stop consuming these (a drained broker) without stopping the others."""
        await self._consumers.retire(consumers, grace_s)

    @property
    def paused_partitions(self) -> int:
        return self._consumers.paused_partitions

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
        await cancel_and_wait(*self._loops, *self._consumers.loops)
        if self._pushers is not None:
            await self._pushers.stop(grace_s)
        await self._in_flight.finish(grace_s)
        await self._consumers.close()
        if not self._direct.empty():
            log.warning("%s: %d direct messages not pushed at close; they stay pending for "
                        "the compensator", self.subscription.id, self._direct.qsize())

    async def _direct_loop(self) -> None:
        while True:
            envelope = await self._direct.get()
            await self._admit(envelope, None)

    async def _admit(self, envelope: Envelope, ack: Ack | None) -> None:
        """Start the message's way to the subscriber. Waits for room among the pushers' ready
        messages (so the consumer reads no faster than the subscriber takes), except for an
        ordered one, which waits in its key's lane instead."""
        if (reason := why_not_pushed(self.subscription, envelope)) is not None:
            self._in_flight.track(self._outcomes.skip(envelope, ack, reason))
        elif (self.subscription.ordered_by_biz_id and envelope.biz_id is not None
              and self._batches is None):
            self._lanes.add(envelope.biz_id, envelope, ack)
        elif (due := wait_until(envelope, self.subscription)) is not None:
            self._delays.admit(envelope, ack, due)
        else:
            await self._hand_on(envelope, ack)

    async def _hand_on(self, envelope: Envelope, ack: Ack | None) -> None:
        """To the batch collector (a batch subscription) or the pushers."""
        if self._batches is not None:
            await self._batches.add(envelope, ack)
        else:
            assert self._pushers is not None
            await self._pushers.put(envelope, ack)
