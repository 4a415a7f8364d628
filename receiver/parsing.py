"""Turning a producer's request into an Envelope, with a clear 4xx for every kind of bad input.

Two forms: a JSON envelope (`parse_envelope`), or a raw body whose attributes travel in
CloudEvents-style headers (`parse_raw`). Whatever passes here must be deliverable: biz_id and
headers become HTTP headers of the push, so control characters are refused up front (a message
that can never be pushed would be retried forever).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from msgbus.errors import InvalidInput, InvalidMessage, MessageTooLarge
from msgbus.models import JSON_CONTENT_TYPE, MAX_DELIVERY_DELAY_S, Envelope
from msgbus.tracecontext import (
    NO_TRACE,
    InvalidTraceContext,
    TraceContext,
    checked_traceparent,
    checked_tracestate,
)

BYTES_CONTENT_TYPE = "application/octet-stream"
MAX_BIZ_ID_CHARS = 256
MAX_HEADERS = 64
MAX_HEADERS_CHARS = 8192  # names and values together: subscribers' servers cap header sizes
MAX_CONTENT_TYPE_CHARS = 255
# raw form: the headers that carry a message's attributes
ID_HEADER, BIZ_ID_HEADER, TIME_HEADER = "ce-id", "ce-bizid", "ce-time"
DELIVER_AT_HEADER, DELAY_HEADER = "ce-deliverat", "ce-delayseconds"
_ATTRIBUTE_HEADERS = (ID_HEADER, BIZ_ID_HEADER, TIME_HEADER, DELIVER_AT_HEADER, DELAY_HEADER)
HEADER_PREFIX = "x-msgbus-"
_RAW_FORM_NAMES = {name.encode() for name in _ATTRIBUTE_HEADERS}
_RAW_FORM_PREFIX = HEADER_PREFIX.encode()

UUID7_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
HEADER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_TOKEN = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
MEDIA_TYPE_PATTERN = rf"^{_TOKEN}/{_TOKEN}([ \t]*;[ \t]*[\x20-\x7e]*)?$"
# used with fullmatch(): in Python "$" also matches before a trailing newline
_UUID7_RE = re.compile(UUID7_PATTERN)
_HEADER_NAME_RE = re.compile(HEADER_NAME_PATTERN)
_MEDIA_TYPE_RE = re.compile(MEDIA_TYPE_PATTERN)
_RFC3339_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}"
                         r"(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_VALUE_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a header value may hold a tab
_INT_RANGE = range(-(2**63), 2**64)
_FIELDS = {"message_id", "biz_id", "created_at", "headers", "body", "body_base64",
           "content_type", "destination", "traceparent", "tracestate", "deliver_at", "delay_s"}
# a deliver_at this far beyond the longest delay is still taken: the producer's clock may be
# ahead of the receiver's, and a client turns delay_s into deliver_at when it spools
DELIVER_AT_CLOCK_SKEW_S = 300.0


def load_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from exc


class ExactJson:
    """The stdlib parse of a request body, made only when a body looks as if it held an
    integer beyond 64 bits: orjson turns those into floats, silently losing digits. Such a
    float is at least 9.2e18, which orjson always writes with "e+": a cheap test that spares
    almost every message the slow parse."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._value: Any = None
        self._parsed = False

    def __call__(self) -> Any:
        if not self._parsed:
            try:
                self._value = json.loads(self._raw)
            except RecursionError as exc:
                raise InvalidInput("request body nests too deeply") from exc
            self._parsed = True
        return self._value


def _holds_huge_integer(value: Any) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, int) and item not in _INT_RANGE:
            return True
    return False


def parse_envelope(
    data: Any, *, destination: str, source_app: str, max_body_bytes: int, now: datetime,
    exact: Callable[[], Any] | None = None, request_trace: TraceContext = NO_TRACE,
) -> Envelope:
    """`data` parsed by orjson; `exact` gives the same message parsed exactly (see ExactJson).
    A message without a traceparent of its own takes the request's (`request_trace`)."""
    if not isinstance(data, dict):
        raise InvalidMessage("a message must be a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InvalidMessage(f"unknown field {unknown[0][:100]!r}", field=unknown[0][:100])
    message_id = _parse_message_id(data.get("message_id"), "message_id")
    body, content_type = _parse_body(data, exact)
    if len(body) > max_body_bytes:
        raise MessageTooLarge(f"message body is {len(body)} bytes; the limit is {max_body_bytes}",
                              field="body")
    traceparent, tracestate = _trace_context(data, request_trace)
    return Envelope(
        message_id=message_id, destination=destination, body=body, content_type=content_type,
        biz_id=_parse_biz_id(data.get("biz_id"), "biz_id"), source_app=source_app,
        created_at=_parse_created_at(data.get("created_at"), now, "created_at"), received_at=now,
        headers=_parse_headers(data.get("headers")),
        traceparent=traceparent, tracestate=tracestate,
        deliver_at=_parse_delivery_time(data.get("deliver_at"), data.get("delay_s"), now,
                                        ("deliver_at", "delay_s")),
    )


def _trace_context(data: dict[str, Any], request_trace: TraceContext) -> TraceContext:
    parent, state = data.get("traceparent"), data.get("tracestate")
    if parent is None:
        if state is not None:
            raise InvalidMessage("tracestate goes with a traceparent", field="tracestate")
        return request_trace
    try:
        parent = checked_traceparent(parent)
    except InvalidTraceContext as exc:
        raise InvalidMessage(str(exc), field="traceparent") from exc
    try:
        return parent, None if state is None else checked_tracestate(state)
    except InvalidTraceContext as exc:
        raise InvalidMessage(str(exc), field="tracestate") from exc


def parse_raw(
    body: bytes, raw_headers: Iterable[tuple[bytes, bytes]], *, destination: str,
    source_app: str, max_body_bytes: int, now: datetime, request_trace: TraceContext = NO_TRACE,
) -> Envelope:
    """A message sent as its own request body: `ce-id` (required), `ce-bizid`, `ce-time` and
    `x-msgbus-<name>` headers carry what the JSON envelope's fields would; `traceparent` and
    `tracestate` (`request_trace`) its trace context."""
    if len(body) > max_body_bytes:
        raise MessageTooLarge(f"message body is {len(body)} bytes; the limit is {max_body_bytes}",
                              field="body")
    attributes: dict[str, str] = {}
    headers: dict[str, str] = {}
    for raw_name, raw_value in raw_headers:
        name = raw_name.decode("latin-1").lower()
        if name in _ATTRIBUTE_HEADERS or name == "content-type":
            attributes.setdefault(name, _header_text(raw_value, name))
        elif name.startswith(HEADER_PREFIX):
            headers[name.removeprefix(HEADER_PREFIX)] = _header_text(raw_value, name)
    content_type = attributes.get("content-type") or BYTES_CONTENT_TYPE
    return Envelope(
        message_id=_parse_message_id(attributes.get(ID_HEADER), ID_HEADER),
        destination=destination, body=body,
        content_type=_parse_content_type(content_type, "content-type"),
        biz_id=_parse_biz_id(attributes.get(BIZ_ID_HEADER), BIZ_ID_HEADER),
        source_app=source_app,
        created_at=_parse_created_at(attributes.get(TIME_HEADER), now, TIME_HEADER),
        received_at=now, headers=_parse_headers(headers or None),
        traceparent=request_trace[0], tracestate=request_trace[1],
        deliver_at=_parse_delivery_time(attributes.get(DELIVER_AT_HEADER),
                                        _delay_header(attributes.get(DELAY_HEADER)), now,
                                        (DELIVER_AT_HEADER, DELAY_HEADER)),
    )


def raw_form_header(raw_headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The first header of the raw form among these (they have no place beside an envelope).
    ASGI servers give header names in lower case."""
    for name, _ in raw_headers:
        if name in _RAW_FORM_NAMES or name.startswith(_RAW_FORM_PREFIX):
            return name.decode("latin-1")
    return None


def _header_text(value: bytes, name: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise InvalidMessage(f"header {name} is not valid UTF-8", field=name) from exc


def _parse_message_id(value: Any, field: str) -> str:
    if value is None:
        raise InvalidMessage(f"{field} is required (a UUIDv7 made by the client)", field=field)
    if not isinstance(value, str) or not _UUID7_RE.fullmatch(value):
        raise InvalidMessage(f"{field} must be a UUIDv7 in lower-case canonical form",
                             field=field)
    return value


def _parse_body(data: dict[str, Any], exact: Callable[[], Any] | None) -> tuple[bytes, str]:
    has_body, has_b64 = "body" in data, "body_base64" in data
    if has_body == has_b64:
        raise InvalidMessage("exactly one of 'body' (JSON) or 'body_base64' is required",
                             field="body")
    if has_body:
        if data.get("content_type") not in (None, JSON_CONTENT_TYPE):
            raise InvalidMessage("'content_type' goes with 'body_base64'; 'body' is JSON",
                                 field="content_type")
        try:
            body = orjson.dumps(data["body"])
        except orjson.JSONEncodeError as exc:  # deeper than orjson writes (254 levels)
            raise InvalidMessage(f"body cannot be encoded: {exc}", field="body") from exc
        if b"e+" in body and exact is not None and _holds_huge_integer(exact().get("body")):
            raise InvalidMessage("body holds an integer beyond 64 bits, which would lose "
                                 "digits; send it as a string, or the bytes as body_base64",
                                 field="body")
        return body, JSON_CONTENT_TYPE
    content_type = _parse_content_type(data.get("content_type") or BYTES_CONTENT_TYPE,
                                       "content_type")
    encoded = data["body_base64"]
    if not isinstance(encoded, str):
        raise InvalidMessage("body_base64 must be a base64 string", field="body_base64")
    try:
        return base64.b64decode(encoded, validate=True), content_type
    except (binascii.Error, ValueError) as exc:
        raise InvalidMessage(f"body_base64 is not valid base64: {exc}",
                             field="body_base64") from exc


def _parse_content_type(value: Any, field: str) -> str:
    if (not isinstance(value, str) or len(value) > MAX_CONTENT_TYPE_CHARS
            or not _MEDIA_TYPE_RE.fullmatch(value)):
        raise InvalidMessage(f"{field} must be a MIME type such as 'image/png' (at most "
                             f"{MAX_CONTENT_TYPE_CHARS} printable ASCII characters)", field=field)
    return value


def _parse_biz_id(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if (not isinstance(value, str) or not 0 < len(value) <= MAX_BIZ_ID_CHARS
            or _CONTROL_RE.search(value)):
        raise InvalidMessage(f"{field} must be a string of 1..{MAX_BIZ_ID_CHARS} characters "
                             "without control characters", field=field)
    return value


def _parse_created_at(value: Any, now: datetime, field: str) -> datetime:
    if value is None:
        return now
    if not isinstance(value, str) or not _RFC3339_RE.fullmatch(value):
        raise InvalidMessage(f"{field} must be an RFC 3339 time with a zone, such as "
                             "'2026-11-21T10:00:00.123Z'", field=field)
    try:
        return datetime.fromisoformat(value.upper()).astimezone(UTC)
    except (ValueError, OverflowError) as exc:  # e.g. month 13, or year 1 at UTC+1
        raise InvalidMessage(f"{field} is not a valid time: {value!r}", field=field) from exc


def _parse_delivery_time(deliver_at: Any, delay_s: Any, now: datetime,
                         fields: tuple[str, str]) -> datetime | None:
    """When the message may first be pushed: `deliver_at` (RFC 3339; one in the past means
    now), or `delay_s` after `now`; at most MAX_DELIVERY_DELAY_S ahead. None: at once."""
    at_field, delay_field = fields
    if deliver_at is not None and delay_s is not None:
        raise InvalidMessage(f"give {at_field} or {delay_field}, not both", field=delay_field)
    if delay_s is not None:
        if (isinstance(delay_s, bool) or not isinstance(delay_s, int | float)
                or not 0 <= delay_s <= MAX_DELIVERY_DELAY_S):
            raise InvalidMessage(f"{delay_field} must be a number of seconds from 0 to "
                                 f"{MAX_DELIVERY_DELAY_S:.0f} (30 days)", field=delay_field)
        return now + timedelta(seconds=delay_s) if delay_s > 0 else None
    if deliver_at is None:
        return None
    at = _parse_created_at(deliver_at, now, at_field)
    limit = now + timedelta(seconds=MAX_DELIVERY_DELAY_S + DELIVER_AT_CLOCK_SKEW_S)
    if at > limit:
        raise InvalidMessage(f"{at_field} is more than 30 days ahead: {deliver_at!r}",
                             field=at_field)
    return at


def _delay_header(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        delay = float(value)
    except ValueError:
        raise InvalidMessage(f"{DELAY_HEADER} must be a number of seconds",
                             field=DELAY_HEADER) from None
    if not math.isfinite(delay):
        raise InvalidMessage(f"{DELAY_HEADER} must be a number of seconds", field=DELAY_HEADER)
    return delay


def _parse_headers(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if (not isinstance(value, dict) or len(value) > MAX_HEADERS
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
        raise InvalidMessage(f"headers must be an object of at most {MAX_HEADERS} string values",
                             field="headers")
    for name, text in value.items():
        if not _HEADER_NAME_RE.fullmatch(name):
            raise InvalidMessage(f"header name {name[:64]!r} must be 1-64 letters, digits, "
                                 "'-' or '_'", field="headers")
        if _VALUE_CONTROL_RE.search(text):
            raise InvalidMessage(f"header {name!r} holds a control character", field="headers")
    if sum(len(k) + len(v) for k, v in value.items()) > MAX_HEADERS_CHARS:
        raise InvalidMessage(f"headers hold more than {MAX_HEADERS_CHARS} characters",
                             field="headers")
    return value
