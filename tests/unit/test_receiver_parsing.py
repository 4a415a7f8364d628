"""The receiver's parsing never fails with anything but a 4xx MsgbusError, and what it accepts
can be buffered and pushed (hypothesis property tests, plus the edge cases that motivated them)."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbus.codec import decode, encode
from msgbus.delivery.headers import push_headers
from msgbus.errors import MsgbusError
from msgbus.ids import uuid7
from msgbus.models import Envelope, Subscription
from receiver.parsing import ExactJson, load_json, parse_envelope, parse_raw

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
MAX_BODY = 64 * 1024
SUBSCRIPTION = Subscription(destination="orders", name="audit", url="http://127.0.0.1:1/hook")
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BAD_HEADER_VALUE_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, database=None,
                             suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])

scalars = (st.none() | st.booleans() | st.integers() | st.text()
           | st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                         max_size=4),
    max_leaves=20)
deep_lists = st.integers(1, 400).map(lambda depth: json.loads("[" * depth + "]" * depth))
offsets = st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))
times = st.one_of(
    st.datetimes(timezones=offsets).map(datetime.isoformat),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat().replace("+00:00", "Z")),
    st.text(max_size=40))
text_or_any = st.text() | json_values
bodies = (json_values | deep_lists
          | st.integers().map(lambda n: {"n": n * 10**18}))  # beyond 64 bits too
base64_bodies = st.binary().map(lambda b: base64.b64encode(b).decode())
content_types = st.sampled_from(["image/png", "application/json", "text/plain; charset=x"])
header_maps = st.dictionaries(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,70}", fullmatch=True)
                              | st.text(max_size=5), st.text(max_size=200), max_size=70)
# Messages that are valid but for a field or two (each field: a valid value or anything),
# so that every check is reached; and messages made of anything at all.
nearly_valid = st.fixed_dictionaries(
    {"message_id": st.builds(uuid7)},
    optional={"biz_id": st.text(max_size=300), "created_at": times, "headers": header_maps,
              "content_type": content_types}) | st.fixed_dictionaries({}, optional={
                  "message_id": st.builds(uuid7) | st.uuids().map(str) | text_or_any,
                  "biz_id": text_or_any, "created_at": text_or_any, "headers": text_or_any,
                  "content_type": content_types | text_or_any, "destination": text_or_any,
                  "colour": st.text()})
envelopes = st.builds(
    lambda fields, body: {**fields, **body}, nearly_valid,
    st.fixed_dictionaries({"body": bodies}) | st.fixed_dictionaries({"body_base64": base64_bodies
                                                                     | text_or_any})
    | st.fixed_dictionaries({}, optional={"body": bodies, "body_base64": base64_bodies}))


def assert_deliverable(envelope: Envelope) -> None:
    """Buffered (codec) and pushed (HTTP headers) without an error."""
    decoded = decode(encode(envelope))
    assert abs(decoded.created_at - envelope.created_at) < timedelta(milliseconds=1)
    decoded.created_at = envelope.created_at  # the codec keeps milliseconds
    assert decoded == envelope
    for name, value in push_headers(envelope, SUBSCRIPTION, attempt=1).items():
        assert _TOKEN_RE.fullmatch(name), name
        assert not _BAD_HEADER_VALUE_RE.search(value), (name, value)


def parse_or_4xx(data: Any, exact: ExactJson | None = None) -> Envelope | None:
    try:
        envelope = parse_envelope(data, destination="orders", source_app="shop",
                                  max_body_bytes=MAX_BODY, now=NOW, exact=exact)
    except MsgbusError as exc:
        assert 400 <= exc.status_code < 500, exc
        assert exc.message
        return None
    assert_deliverable(envelope)
    return envelope


@PROPERTY_SETTINGS
@given(data=json_values | envelopes)
def test_parse_envelope_accepts_or_answers_4xx(data: Any) -> None:
    parse_or_4xx(data)


@PROPERTY_SETTINGS
@given(data=envelopes)
def test_json_bytes_parse_to_an_envelope_or_a_4xx(data: Any) -> None:
    """Through the wire: stdlib JSON (which writes integers of any size) then load_json."""
    raw = json.dumps(data).encode()
    try:
        loaded = load_json(raw)
    except MsgbusError as exc:
        assert 400 <= exc.status_code < 500
        return
    envelope = parse_or_4xx(loaded, ExactJson(raw))
    if envelope is not None and "body" in data:
        assert json.loads(envelope.body) == data["body"]  # no digit lost, nothing changed


@PROPERTY_SETTINGS
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_load_json_of_any_bytes_is_a_value_or_a_4xx(raw: bytes) -> None:
    try:
        load_json(raw)
    except MsgbusError as exc:
        assert 400 <= exc.status_code < 500


header_names = st.sampled_from([b"ce-id", b"ce-bizid", b"ce-time", b"content-type",
                                b"x-msgbus-trace", b"X-Msgbus-A b", b"x-msgbus-", b"other"])
header_values = st.binary(max_size=60) | st.builds(lambda: uuid7().encode()) | st.sampled_from(
    [b"image/png", b"2026-01-02T03:04:05Z", "订单-1".encode()])


@PROPERTY_SETTINGS
@given(headers=st.lists(st.tuples(header_names, header_values), max_size=8),
       body=st.binary(max_size=100))
def test_parse_raw_accepts_or_answers_4xx(headers: list[tuple[bytes, bytes]],
                                          body: bytes) -> None:
    try:
        envelope = parse_raw(body, headers, destination="orders", source_app="shop",
                             max_body_bytes=MAX_BODY, now=NOW)
    except MsgbusError as exc:
        assert 400 <= exc.status_code < 500, exc
        return
    assert envelope.body == body
    assert_deliverable(envelope)


@pytest.mark.parametrize(("data", "field"), [
    ({"body": 1, "message_id": "0190b7e4-1c2d-4e5f-8a6b-7c8d9e0f1a2b"}, "message_id"),  # v4
    ({"body": 1, "message_id": uuid7() + "\n"}, "message_id"),
    ({"body": json.loads("[" * 300 + "]" * 300)}, "body"),
    ({"body": {"n": 2**64}}, "body"),
    ({"body": 1, "biz_id": "order\r\n42"}, "biz_id"),
    ({"body": 1, "headers": {"a b": "v"}}, "headers"),
    ({"body": 1, "headers": {"trace": "a\nb"}}, "headers"),
    ({"body_base64": "", "content_type": "image/png\r\nx-evil: 1"}, "content_type"),
    ({"body": 1, "created_at": "0001-01-01T00:00:00+01:00"}, "created_at"),
    ({"body": 1, "created_at": "2026-01-02T03:04:05"}, "created_at"),
])
def test_undeliverable_or_ambiguous_input_is_refused(data: dict[str, Any], field: str) -> None:
    data.setdefault("message_id", uuid7())
    with pytest.raises(MsgbusError) as caught:
        parse_envelope(data, destination="orders", source_app="shop", max_body_bytes=MAX_BODY,
                       now=NOW)
    assert caught.value.status_code == 422
    assert caught.value.field == field


@pytest.mark.parametrize(("number", "accepted"), [
    ("123456789012345678901234567890", False), ("-9223372036854775809", False),
    ("18446744073709551615", True), ("-9223372036854775808", True), ("1e+30", True),
    ("6.02214076e23", True), ('"123456789012345678901234567890"', True)])
def test_integers_beyond_64_bits_are_refused_instead_of_rounded(number: str,
                                                                accepted: bool) -> None:
    raw = f'{{"message_id": "{uuid7()}", "body": {{"n": {number}, "s": "e+"}}}}'.encode()

    def parse() -> Envelope:
        return parse_envelope(load_json(raw), destination="orders", source_app="shop",
                              max_body_bytes=MAX_BODY, now=NOW, exact=ExactJson(raw))

    if accepted:
        assert json.loads(parse().body)["n"] == json.loads(number)
    else:
        with pytest.raises(MsgbusError) as caught:
            parse()
        assert (caught.value.status_code, caught.value.field) == (422, "body")


def test_a_raw_message_takes_its_attributes_from_headers() -> None:
    message_id = uuid7()
    envelope = parse_raw(b"\x89PNG", [(b"content-type", b"image/png"),
                                      (b"ce-id", message_id.encode()),
                                      (b"ce-bizid", "订单-1".encode()),
                                      (b"ce-time", b"2026-01-02T03:04:05.5+01:00"),
                                      (b"x-msgbus-trace", b"t-1")],
                         destination="orders", source_app="shop", max_body_bytes=MAX_BODY,
                         now=NOW)
    assert (envelope.message_id, envelope.content_type, envelope.biz_id) == (
        message_id, "image/png", "订单-1")
    assert envelope.created_at == datetime(2026, 1, 2, 2, 4, 5, 500000, tzinfo=UTC)
    assert envelope.headers == {"trace": "t-1"}
