"""`OrderedLanes`: order per biz_id in a subscription worker (`ordered_by_biz_id`). Each key
has a lane: its next message is pushed only after the previous one succeeded or was parked, a
failed one is retried in place (state `retrying`) rather than handed to the compensator, and a
head that is not due yet is waited for in place. Different keys go in parallel, each lane in a
task of its own. (A batch subscription keeps order in its `BatchCollector` instead.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from dispatcher.context import PushContext
from dispatcher.delays import sleep_until_due
from dispatcher.outcomes import Ack, OutcomeRecorder
from dispatcher.pushers import push_once
from msgbus.delivery.schedule import scheduled_outcome, wait_until
from msgbus.metrics import SCHEDULED
from msgbus.models import Envelope, utcnow


class OrderedLanes:
    def __init__(self, context: PushContext, outcomes: OutcomeRecorder) -> None:
        self._sub, self._limiter = context.subscription, context.limiter
        self._sender = context.sender
        self._track, self._closing = context.track, context.closing
        self._outcomes = outcomes
        # per biz_id, the messages waiting for the one being delivered (the lane's head)
        self._lanes: dict[str, deque[tuple[Envelope, Ack | None]]] = {}

    def add(self, key: str, envelope: Envelope, ack: Ack | None) -> None:
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append((envelope, ack))
            return
        self._lanes[key] = deque([(envelope, ack)])
        self._track(self._run(key))

    async def _run(self, key: str) -> None:
        """Delivers one biz_id's messages one after the other, each until it succeeded or was
        parked. If the worker stops meanwhile, the unacked rest comes back from the broker."""
        lane = self._lanes[key]
        try:
            while lane and not self._closing.is_set():
                envelope, ack = lane[0]
                if not await self._wait_until_due(envelope):
                    break
                if not await self._limiter.acquire(self._closing):
                    break
                await self._deliver(envelope, ack)
                lane.popleft()
        finally:
            del self._lanes[key]

    async def _wait_until_due(self, envelope: Envelope) -> bool:
        """Order beats delay: a key's head that is due later is recorded as scheduled (held
        here, not by the compensator) and waited for in place, and the key's later messages
        wait behind it. False: the worker closes meanwhile (unacked: the broker hands the
        message on, and the next worker waits for it again)."""
        due = wait_until(envelope, self._sub)
        if due is None:
            return True
        SCHEDULED.labels(self._sub.id).inc()
        await self._outcomes.record([scheduled_outcome(envelope, self._sub, due,
                                                       self._sender.instance, in_place=True)])
        await sleep_until_due(envelope, self._sub, due, self._closing)
        return not self._closing.is_set()

    async def _deliver(self, envelope: Envelope, ack: Ack | None) -> None:
        """Called with a slot acquired: pushes the message, and after a failure again (after
        the policy's delay) until it succeeds or the policy parks it; the next message of its
        key waits meanwhile."""
        attempt = 1
        while True:
            outcome = await push_once(self._limiter, self._sender, envelope, self._sub,
                                      attempt, retry_in_place=True)
            await self._outcomes.record([outcome])
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
