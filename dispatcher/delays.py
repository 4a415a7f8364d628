"""`DelayedMessages`: what a subscription worker does with a message that is not due yet (its
delay, or the time its producer asked for). One due within `HOLD_IN_MEMORY_S` waits in the
worker, unacked; one due later is recorded as scheduled, and the compensator pushes it then.
An ordered subscription's lanes wait for their heads in place instead (`dispatcher.lanes`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime

from dispatcher.context import PushContext
from dispatcher.outcomes import Ack, OutcomeRecorder
from msgbus.delivery.schedule import scheduled_outcome, wait_until
from msgbus.metrics import SCHEDULED
from msgbus.models import Envelope, Subscription, utcnow

# A message due within this long waits in the worker, not in MongoDB: the compensator's scan
# interval and the trace's way to MongoDB would make it later than the wait itself. Held
# messages are unacked, so at most a quarter of the in-flight budget is held at once.
HOLD_IN_MEMORY_S = 3.0

HandOn = Callable[[Envelope, Ack | None], Awaitable[None]]


async def sleep_until_due(envelope: Envelope, subscription: Subscription,
                          due: datetime | None, closing: asyncio.Event) -> None:
    """Until due by the wall clock (the loop's timers may end a little early), or until
    `closing` is set."""
    while due is not None and not closing.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), (due - utcnow()).total_seconds() + 0.001)
        due = wait_until(envelope, subscription)


class DelayedMessages:
    def __init__(self, context: PushContext, outcomes: OutcomeRecorder, hand_on: HandOn) -> None:
        """`hand_on`: where a held message goes once due (the pushers or the batch
        collector)."""
        self._sub, self._instance = context.subscription, context.sender.instance
        self._track, self._closing = context.track, context.closing
        self._outcomes = outcomes
        self._hand_on = hand_on
        self._held = 0  # messages due soon, waiting in `_push_when_due`

    def admit(self, envelope: Envelope, ack: Ack | None, due: datetime) -> None:
        """Held here until `due` if it is soon and there is room, else scheduled."""
        if self._may_hold(due):
            self._track(self._push_when_due(envelope, ack, due))
        else:
            self._schedule(envelope, ack, due)

    def _may_hold(self, due: datetime) -> bool:
        return ((due - utcnow()).total_seconds() <= HOLD_IN_MEMORY_S
                and self._held < self._sub.in_flight_budget // 4)

    async def _push_when_due(self, envelope: Envelope, ack: Ack | None,
                             due: datetime | None) -> None:
        """Due within HOLD_IN_MEMORY_S: held here, unacked (the broker hands it on if this
        process dies), then handed on."""
        self._held += 1
        try:
            await sleep_until_due(envelope, self._sub, due, self._closing)
        finally:
            self._held -= 1
        if not self._closing.is_set():
            await self._hand_on(envelope, ack)

    def _schedule(self, envelope: Envelope, ack: Ack | None, due: datetime) -> None:
        """Due later: recorded as scheduled (the compensator pushes it then), then acked; the
        record is on local disk before the ack, so a kill -9 loses no delay."""
        SCHEDULED.labels(self._sub.id).inc()
        self._outcomes.collect(scheduled_outcome(envelope, self._sub, due, self._instance), ack)
