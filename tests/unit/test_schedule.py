"""Delayed delivery: the due-time rule, the envelope's deliver_at through the codec, the
receiver's and the client's checks of deliver_at / delay_s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from msgbus_client.errors import InvalidMessageError
from msgbus_client.message import build_entry

from msgbus import codec
from msgbus.delivery.schedule import due_at, due_time, scheduled_outcome, wait_until
from msgbus.errors import InvalidMessage
from msgbus.models import DeliveryStatus, Envelope, Subscription
from receiver.parsing import parse_envelope, parse_raw

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
ID = "0190f6f2-3b4c-7d5e-8f60-112233445566"


def _sub(delay_s: float = 0.0) -> Subscription:
    return Subscription(destination="orders", name="billing", url="http://127.0.0.1:1/x",
                        delay_s=delay_s)


def _envelope(deliver_at: datetime | None = None) -> Envelope:
    return Envelope(message_id=ID, destination="orders", body=b"{}", created_at=T0,
                    received_at=T0 + timedelta(seconds=1), deliver_at=deliver_at)


def test_due_is_the_later_of_deliver_at_and_acceptance_plus_the_subscription_delay() -> None:
    accepted = T0 + timedelta(seconds=1)
    assert due_at(_envelope(), _sub()) is None
    assert due_at(_envelope(), _sub(30)) == accepted + timedelta(seconds=30)
    assert due_at(_envelope(T0 + timedelta(hours=1)), _sub(30)) == T0 + timedelta(hours=1)
    assert due_at(_envelope(T0 + timedelta(seconds=5)), _sub(30)) == accepted + timedelta(
        seconds=30)
    assert due_time(None, accepted, 0) is None


def test_a_due_time_passed_means_push_now_and_one_ahead_waits_even_a_millisecond() -> None:
    assert wait_until(_envelope(T0 - timedelta(days=1)), _sub(), now=T0) is None
    assert wait_until(_envelope(T0), _sub(), now=T0) is None
    soon = T0 + timedelta(milliseconds=10)
    assert wait_until(_envelope(soon), _sub(), now=T0) == soon  # never early
    later = T0 + timedelta(seconds=3)
    assert wait_until(_envelope(later), _sub(), now=T0) == later


def test_scheduled_outcome_is_no_push_and_held_in_place_has_no_due_time() -> None:
    due = T0 + timedelta(minutes=5)
    outcome = scheduled_outcome(_envelope(due), _sub(), due, "d1")
    assert not outcome.pushed and outcome.next_attempt_at == due and outcome.scheduled_for == due
    held = scheduled_outcome(_envelope(due), _sub(), due, "d1", in_place=True)
    assert held.next_attempt_at is None and held.retrying_in_place
    assert DeliveryStatus.SCHEDULED.value == "scheduled"


def test_codec_round_trip_keeps_deliver_at_to_the_millisecond() -> None:
    at = datetime(2026, 12, 1, 8, 30, 15, 123000, tzinfo=UTC)
    assert codec.decode(codec.encode(_envelope(at))).deliver_at == at
    assert codec.decode(codec.encode(_envelope())).deliver_at is None


def _parse(**fields: object) -> Envelope:
    return parse_envelope({"message_id": ID, "body": {}, **fields}, destination="orders",
                          source_app="app", max_body_bytes=1000, now=T0)


def test_receiver_takes_deliver_at_or_delay_s() -> None:
    assert _parse(delay_s=90).deliver_at == T0 + timedelta(seconds=90)
    assert _parse(delay_s=0).deliver_at is None
    assert _parse(deliver_at="2026-11-27T10:00:00Z").deliver_at == T0 + timedelta(days=1)
    past = _parse(deliver_at="2020-01-01T00:00:00+01:00").deliver_at
    assert past is not None and past < T0  # passed: delivered at once, as asked
    raw = parse_raw(b"x", [(b"ce-id", ID.encode()), (b"ce-delayseconds", b"2.5")],
                    destination="orders", source_app="app", max_body_bytes=10, now=T0)
    assert raw.deliver_at == T0 + timedelta(seconds=2.5)


@pytest.mark.parametrize(("fields", "field"), [
    ({"delay_s": 31 * 24 * 3600}, "delay_s"),
    ({"delay_s": -1}, "delay_s"),
    ({"delay_s": True}, "delay_s"),
    ({"delay_s": "10"}, "delay_s"),
    ({"deliver_at": "2026-12-27T10:00:00Z"}, "deliver_at"),  # 31 days ahead
    ({"deliver_at": "tomorrow"}, "deliver_at"),
    ({"deliver_at": "2026-11-27T10:00:00"}, "deliver_at"),  # no zone
    ({"deliver_at": 1_790_000_000}, "deliver_at"),
    ({"deliver_at": "2026-11-27T10:00:00Z", "delay_s": 5}, "delay_s"),
])
def test_receiver_refuses_bad_delays_naming_the_field(fields: dict[str, object],
                                                       field: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        _parse(**fields)
    assert caught.value.status_code == 422 and caught.value.field == field


def test_client_turns_a_delay_into_deliver_at_when_the_message_is_created() -> None:
    import orjson
    entry = build_entry("orders", {"a": 1}, delay_s=60)
    doc = orjson.loads(entry.payload)
    created = datetime.fromisoformat(doc["created_at"])
    assert datetime.fromisoformat(doc["deliver_at"]) - created == timedelta(seconds=60)
    at = datetime.now(UTC) + timedelta(hours=2)
    doc = orjson.loads(build_entry("orders", {}, deliver_at=at).payload)
    assert abs(datetime.fromisoformat(doc["deliver_at"]) - at) < timedelta(milliseconds=2)
    assert "deliver_at" not in orjson.loads(build_entry("orders", {}).payload)


@pytest.mark.parametrize("options", [
    {"delay_s": 31 * 24 * 3600.0}, {"delay_s": -1}, {"delay_s": "5"},
    {"deliver_at": datetime(2030, 1, 1)},  # naive
    {"deliver_at": "2030-01-01T00:00:00Z"},
    {"deliver_at": datetime.now(UTC) + timedelta(days=31)},
    {"deliver_at": datetime.now(UTC), "delay_s": 1},
])
def test_client_refuses_bad_delays_before_spooling(options: dict[str, object]) -> None:
    with pytest.raises(InvalidMessageError):
        build_entry("orders", {}, **options)  # type: ignore[arg-type]
