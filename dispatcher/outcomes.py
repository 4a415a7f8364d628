"""`OutcomeRecorder`: where a subscription worker's outcomes go before their messages are acked.
Each outcome is written to the dispatcher's local trace buffer (`TraceWriter`) first, and the
broker is acked only once it is durable there; the delivered ones are remembered by the
redelivery check (`DeliveredCheck`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dispatcher.context import Track
from dispatcher.redelivery import DeliveredCheck
from dispatcher.trace import TraceWriter
from msgbus.delivery.attempt import skipped_outcome
from msgbus.metrics import SKIPPED
from msgbus.models import DeliveryOutcome, Envelope, Subscription

log = logging.getLogger(__name__)

Ack = Callable[[], None]


class OutcomeRecorder:
    def __init__(self, subscription: Subscription, instance: str, trace: TraceWriter,
                 delivered: DeliveredCheck, *, track: Track) -> None:
        self._sub = subscription
        self._instance = instance
        self._trace = trace
        self._delivered = delivered
        self._track = track
        self._to_record: list[tuple[DeliveryOutcome, Ack | None]] = []

    def collect(self, outcome: DeliveryOutcome, ack: Ack | None) -> None:
        """Records the outcome with the others of this turn of the loop, then acks."""
        if not self._to_record:
            asyncio.get_running_loop().call_soon(self._record_collected)
        self._to_record.append((outcome, ack))

    def _record_collected(self) -> None:
        """The outcomes collected in one turn of the loop: one local write, then their acks,
        in one task."""
        collected, self._to_record = self._to_record, []
        self._track(self._record_then_ack(collected))

    async def _record_then_ack(self, collected: list[tuple[DeliveryOutcome, Ack | None]]
                               ) -> None:
        await self.record([outcome for outcome, _ in collected])
        for _, ack in collected:
            if ack is not None:
                ack()

    async def skip(self, envelope: Envelope, ack: Ack | None, reason: str) -> None:
        """Filtered out or skipped by an operator: recorded as skipped (not lost, not
        retried), then acked."""
        SKIPPED.labels(self._sub.id).inc()
        await self.record([skipped_outcome(envelope, self._sub, reason, self._instance)])
        if ack is not None:
            ack()

    async def record(self, outcomes: list[DeliveryOutcome]) -> None:
        """The broker is acked only once the outcome is durable: retried until it is."""
        while True:
            try:
                await self._trace.record(outcomes)
                self._delivered.remember((self._sub.id, o.result.message_id)
                                         for o in outcomes if not o.retrying_in_place)
                return
            except Exception:
                log.exception("%s: recording an outcome failed; retrying", self._sub.id)
                await asyncio.sleep(1.0)
