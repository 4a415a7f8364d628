"""`Pushers`: a subscription worker's `max_concurrency` pushers, which take the admitted
messages from a queue of that size, push each once within the subscription's limiter, and hand
the outcome to the recorder. `push_once` is the one push, for the ordered lanes too."""

from __future__ import annotations

import asyncio

from dispatcher.context import PushContext
from dispatcher.outcomes import Ack, OutcomeRecorder
from msgbus.delivery.attempt import outcome_of, push_through
from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.sender import Sender
from msgbus.models import DeliveryOutcome, Envelope, Subscription


async def push_once(limiter: SubscriptionLimiter, sender: Sender, envelope: Envelope,
                    subscription: Subscription, attempt: int, *,
                    retry_in_place: bool) -> DeliveryOutcome:
    """One push (called with a slot acquired) and what it means for the delivery. The
    broker's unacked window bounds how many messages are between push and ack."""
    result = await push_through(limiter, sender, envelope, subscription, attempt)
    return outcome_of(result, envelope, subscription, attempts_so_far=attempt,
                      retry_in_place=retry_in_place)


class Pushers:
    def __init__(self, context: PushContext, outcomes: OutcomeRecorder) -> None:
        self._sub, self._limiter = context.subscription, context.limiter
        self._sender = context.sender
        self._closing = context.closing
        self._outcomes = outcomes
        # admitted messages; None tells a pusher to stop
        self._ready: asyncio.Queue[tuple[Envelope, Ack | None] | None] = asyncio.Queue(
            maxsize=self._sub.max_concurrency)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._pusher(), name=f"push-{self._sub.id}")
                       for _ in range(self._sub.max_concurrency)]

    async def put(self, envelope: Envelope, ack: Ack | None) -> None:
        """Waits for room among the ready messages (so the consumer reads no faster than the
        subscriber takes)."""
        await self._ready.put((envelope, ack))

    async def _pusher(self) -> None:
        """Takes the next message as soon as its push is answered (no task per message, no
        wait for the consume loop), hands the outcome to the recorder, goes on."""
        while (item := await self._ready.get()) is not None:
            envelope, ack = item
            if not await self._limiter.acquire(self._closing):
                return  # closing: not pushed, not acked; the broker hands it on
            outcome = await push_once(self._limiter, self._sender, envelope, self._sub, 1,
                                      retry_in_place=False)
            self._outcomes.collect(outcome, ack)

    async def stop(self, grace_s: float) -> None:
        """Pushes under way finish; messages still waiting are left unacked (the broker hands
        them to the next worker, nobody got them yet)."""
        while not self._ready.empty():
            self._ready.get_nowait()
        for _ in self._tasks:
            self._ready.put_nowait(None)
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
