"""The body of a batch push: a CloudEvents JSON batch that the CloudEvents SDK reads back event by
event (JSON bodies as `data` byte for byte, other bodies as `data_base64`), cut at the
subscription's message and byte limits; and the settings' validation."""

from __future__ import annotations

import base64
import json

import orjson
import pytest
from cloudevents.core.formats.json import JSONFormat
from pydantic import ValidationError

from msgbus.delivery.batch import BatchBuilder, batches_of
from msgbus.ids import uuid7
from msgbus.models import Envelope, Subscription, SubscriptionSettings

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def subscription(**fields: object) -> Subscription:
    return Subscription.model_validate({"destination": "orders", "name": "billing",
                                        "url": "http://127.0.0.1/hook",
                                        "batch_max_messages": 100, **fields})


def envelope(body: bytes = b'{"order": 42, "price": 1.50}', **fields: object) -> Envelope:
    return Envelope(message_id=uuid7(), destination="orders", body=body, **fields)  # type: ignore[arg-type]


def test_every_attribute_a_single_push_carries_is_in_its_event() -> None:
    sub = subscription()
    message = envelope(biz_id="订单 42", source_app="shop", traceparent=PARENT,
                       tracestate="k=v", headers={"tier": "gold"})
    [batch] = batches_of([(message, 3)], sub)
    [event] = orjson.loads(batch.body)
    assert event | {"data": None} == {
        "specversion": "1.0", "id": message.message_id, "source": "msgbus/shop",
        "type": "orders", "time": message.created_at.isoformat().replace("+00:00", "Z"),
        "datacontenttype": "application/json", "subscription": "billing", "attempt": 3,
        "bizid": "订单 42", "traceparent": PARENT, "tracestate": "k=v",
        "msgbusheaders": '{"tier":"gold"}', "data": None}
    assert b'"data":{"order": 42, "price": 1.50}' in batch.body  # the JSON body as it is


def test_the_cloudevents_sdk_reads_each_event_json_and_binary() -> None:
    binary = bytes(range(256))
    messages = [envelope(), envelope(binary, content_type="application/x-protobuf"),
                envelope(b"not json", content_type="application/json")]
    [batch] = batches_of([(m, 1) for m in messages], subscription())
    events = [JSONFormat().read(None, json.dumps(e)) for e in json.loads(batch.body)]
    assert [e.get_id() for e in events] == [m.message_id for m in messages]
    assert events[0].get_data() == {"order": 42, "price": 1.5}
    assert events[1].get_data() == binary
    assert events[2].get_data() == b"not json"  # labelled JSON but not: carried as bytes
    assert json.loads(batch.body)[1]["data_base64"] == base64.b64encode(binary).decode()


def test_batches_are_cut_at_the_message_limit_in_order() -> None:
    messages = [envelope() for _ in range(25)]
    batches = batches_of([(m, 1) for m in messages], subscription(batch_max_messages=10))
    assert [len(b) for b in batches] == [10, 10, 5]
    assert [e for b in batches for e in b.envelopes] == messages
    assert len({b.batch_id for b in batches}) == 3


def test_batches_stay_within_the_byte_limit_and_a_large_message_goes_alone() -> None:
    sub = subscription(batch_max_bytes=4096)
    small = [envelope(b'{"pad": "' + b"x" * 900 + b'"}') for _ in range(10)]
    large = envelope(b'{"pad": "' + b"y" * 10_000 + b'"}')
    batches = batches_of([(m, 1) for m in [*small[:5], large, *small[5:]]], sub)
    assert all(len(b.body) <= 4096 for b in batches if len(b) > 1)
    assert [large] in [b.envelopes for b in batches]
    assert all(b.size == len(b.body) for b in batches)
    assert sum(len(b) for b in batches) == 11


def test_a_full_builder_refuses_unless_forced() -> None:
    builder = BatchBuilder(subscription(batch_max_messages=2))
    assert builder.add(envelope(), 1) and builder.add(envelope(), 1)
    assert builder.full and not builder.add(envelope(), 1)
    assert builder.add(envelope(), 2, force=True) and len(builder.batch) == 3


@pytest.mark.parametrize(("fields", "says"), [
    ({"batch_max_messages": 0}, "batch_max_messages"),
    ({"batch_max_messages": 1001}, "batch_max_messages"),
    ({"batch_max_bytes": 100}, "batch_max_bytes"),
    ({"batch_max_wait_ms": -1}, "batch_max_wait_ms"),
    ({"batch_max_wait_ms": 60_001}, "batch_max_wait_ms"),
    ({"batch_max_messages": 100, "max_in_flight": 50}, "must be at least batch_max_messages"),
])
def test_bad_batch_settings_are_refused_with_what_is_wrong(fields: dict[str, object],
                                                          says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        SubscriptionSettings.model_validate({"url": "http://127.0.0.1/hook", **fields})


def test_one_message_per_batch_is_single_pushes() -> None:
    assert not subscription(batch_max_messages=1).batched
    assert not subscription(batch_max_messages=None).batched
    assert subscription(batch_max_messages=2).batched
    assert subscription(batch_max_messages=100, max_concurrency=4).in_flight_budget == 500
