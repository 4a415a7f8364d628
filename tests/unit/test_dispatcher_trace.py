"""The dispatcher's trace buffer (dispatcher/trace.py): an outcome read back from it is the
outcome written, the subscriber's kept answer to a failed push included."""

from __future__ import annotations

from datetime import UTC, datetime

from dispatcher.trace import decode_outcome, encode_outcome
from msgbus.models import AttemptResult, DeliveryOutcome

T0 = datetime(2026, 11, 27, 1, 0, tzinfo=UTC)


def _outcome(status: int, answer: str | None) -> DeliveryOutcome:
    result = AttemptResult(message_id="m1", subscription="orders/s", attempt=1, started_at=T0,
                           latency_ms=3.5, status_code=status, instance="d1", answer=answer)
    return DeliveryOutcome(result=result, destination="orders", created_at=T0, biz_id="b1")


def test_a_failed_push_keeps_its_answer_through_the_trace_buffer() -> None:
    failed = decode_outcome(encode_outcome(_outcome(500, '{"error": "<db> down"}')))
    assert failed.result.answer == '{"error": "<db> down"}'
    assert failed.result.status_code == 500


def test_a_delivered_push_has_no_answer_and_no_extra_field() -> None:
    data = encode_outcome(_outcome(200, None))
    assert b'"an"' not in data
    assert decode_outcome(data).result.answer is None
