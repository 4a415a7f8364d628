"""Which Kafka errors make the receiver replace its producer (msgbus/brokers/kafka.py): the
broker fenced its producer id, or librdkafka declared it fatally failed. A message that timed
out, or a broker that is down, leaves the producer as it is. The replacement itself, against a
tansu that fences after a hang: tests/integration/test_broker_hangs.py."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from msgbus.brokers.kafka import unusable_reason


@pytest.mark.parametrize("code", [KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                                  KafkaError._FENCED])
def test_a_fenced_producer_is_unusable(code: int) -> None:
    reason = unusable_reason(KafkaError(code))
    assert reason is not None and reason.startswith("fenced")


def test_a_fatal_error_makes_the_producer_unusable() -> None:
    error = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "gap", fatal=True)
    assert unusable_reason(error) == "fatal error: gap"


@pytest.mark.parametrize("code", [KafkaError._MSG_TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                                  KafkaError._TRANSPORT, KafkaError.NOT_LEADER_FOR_PARTITION])
def test_other_errors_leave_the_producer_as_it_is(code: int) -> None:
    assert unusable_reason(KafkaError(code)) is None
