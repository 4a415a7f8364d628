"""Turning send() arguments into a spool entry: validation and the wire JSON, done once.

An `Entry` holds the exact JSON body of the single-message endpoint
(`POST /v1/destinations/{code}/messages`); the batch endpoint reuses it with `destination` added,
so a message is encoded exactly once, before it is spooled.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from msgbus_client.errors import InvalidMessageError
from msgbus_client.ids import now_ms, rfc3339_ms, uuid7_with_key
from msgbus_client.tracing import checked_trace_context

JSON_CONTENT_TYPE = "application/json"
BYTES_CONTENT_TYPE = "application/octet-stream"
MAX_DESTINATION_CHARS = 200
MAX_DELAY_S = 30 * 24 * 3600.0  # the bus refuses a message due later than this (422)

_DEST_LEN = struct.Struct(">H")


@dataclass(frozen=True, slots=True)
class Entry:
    """One spooled message: its id, destination and single-endpoint JSON body.

    `key` is the spool key, the 16 id bytes (byte order is time order for UUIDv7); it is
    derived from `message_id` when not given.
    """

    message_id: str
    destination: str
    payload: bytes
    key: bytes = b""

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", uuid.UUID(self.message_id).bytes)

    @property
    def size(self) -> int:
        """Bytes this entry takes in the spool's accounting (key + value)."""
        return 16 + _DEST_LEN.size + len(self.destination.encode()) + len(self.payload)

    def to_value(self) -> bytes:
        dest = self.destination.encode()
        return _DEST_LEN.pack(len(dest)) + dest + self.payload

    @classmethod
    def from_record(cls, key: bytes, value: bytes) -> Entry:
        (size,) = _DEST_LEN.unpack_from(value)
        start = _DEST_LEN.size
        key = bytes(key)
        return cls(
            message_id=str(uuid.UUID(bytes=key)),
            destination=value[start : start + size].decode(),
            payload=bytes(value[start + size :]),
            key=key,
        )

    def batch_item(self) -> bytes:
        """This message as an item of `POST /v1/messages`: the payload plus `destination`."""
        return b'{"destination":' + _dumps(self.destination) + b"," + self.payload[1:]


class MessageOptions(TypedDict, total=False):
    """The keyword options of send(), passed on to `build_entry` as they are."""

    biz_id: str | None
    headers: Mapping[str, str] | None
    content_type: str | None
    traceparent: str | None
    tracestate: str | None
    deliver_at: datetime | None
    delay_s: float | None


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_checked_destinations: set[str] = set()  # an app sends to a handful; checking is on the hot path


def _dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


def _check_destination(destination: object) -> str:
    if destination in _checked_destinations:
        return destination  # mypy narrows it to str: only str are ever added
    if not isinstance(destination, str):
        raise InvalidMessageError(f"destination must be a str, not {type(destination).__name__}")
    if not destination or len(destination) > MAX_DESTINATION_CHARS:
        raise InvalidMessageError(f"destination must have 1..{MAX_DESTINATION_CHARS} characters")
    if "/" in destination or not destination.isprintable() or any(c.isspace() for c in destination):
        raise InvalidMessageError(f"destination {destination!r} has a '/', space or control char")
    if len(_checked_destinations) < 1024:
        _checked_destinations.add(destination)
    return destination


def _check_headers(headers: object) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidMessageError(f"headers must be a mapping, not {type(headers).__name__}")
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessageError("headers must map str to str")
        if not name:
            raise InvalidMessageError("a header name must not be empty")
        checked[name] = value
    return checked


def _deliver_at_ms(deliver_at: object, delay_s: object, created_ms: int) -> int | None:
    """The unix ms before which the message is pushed to no subscriber; None: at once. A
    delay becomes a time here, when the message is created: time in the spool counts."""
    if deliver_at is not None and delay_s is not None:
        raise InvalidMessageError("give deliver_at or delay_s, not both")
    if delay_s is not None:
        if (isinstance(delay_s, bool) or not isinstance(delay_s, int | float)
                or not 0 <= delay_s <= MAX_DELAY_S):
            raise InvalidMessageError(
                f"delay_s must be a number of seconds from 0 to {MAX_DELAY_S:.0f} (30 days)")
        return created_ms + round(delay_s * 1000) if delay_s > 0 else None
    if deliver_at is None:
        return None
    if not isinstance(deliver_at, datetime) or deliver_at.utcoffset() is None:
        raise InvalidMessageError("deliver_at must be a datetime with a time zone "
                                  "(e.g. datetime.now(UTC) + timedelta(hours=1))")
    at_ms = math.ceil(deliver_at.timestamp() * 1000)  # never a millisecond early
    if at_ms - created_ms > MAX_DELAY_S * 1000:
        raise InvalidMessageError(f"deliver_at is more than 30 days ahead: {deliver_at}")
    return max(at_ms, created_ms)


def build_entry(
    destination: str,
    message: object,
    *,
    biz_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    content_type: str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    deliver_at: datetime | None = None,
    delay_s: float | None = None,
) -> Entry:
    """Validate and encode one message, giving it a new id and created_at.

    `message` is any JSON-serialisable value, or bytes (sent as `body_base64` with
    `content_type`, default application/octet-stream). `traceparent` and `tracestate`: its
    W3C trace context; by default the caller's current OpenTelemetry span's (see tracing.py).
    `deliver_at` (an aware datetime) or `delay_s` (seconds from now): the bus pushes the
    message to no subscriber before then; at most 30 days ahead; a time passed means now.
    Raises InvalidMessageError.
    """
    dest = _check_destination(destination)
    if biz_id is not None and not isinstance(biz_id, str):
        raise InvalidMessageError(f"biz_id must be a str or None, not {type(biz_id).__name__}")
    if content_type is not None and (not isinstance(content_type, str) or not content_type):
        raise InvalidMessageError("content_type must be a non-empty str")
    checked_headers = _check_headers(headers)
    trace_parent, trace_state = checked_trace_context(traceparent, tracestate)

    created = now_ms()
    deliver_at_ms = _deliver_at_ms(deliver_at, delay_s, created)
    message_id, key = uuid7_with_key(created)
    doc: dict[str, Any] = {"message_id": message_id, "created_at": rfc3339_ms(created)}
    if deliver_at_ms is not None:
        doc["deliver_at"] = rfc3339_ms(deliver_at_ms)
    if biz_id is not None:
        doc["biz_id"] = biz_id
    if checked_headers:
        doc["headers"] = checked_headers
    if trace_parent is not None:
        doc["traceparent"] = trace_parent
        if trace_state is not None:
            doc["tracestate"] = trace_state
    if isinstance(message, bytes | bytearray | memoryview):
        doc["body_base64"] = base64.b64encode(message).decode("ascii")
        doc["content_type"] = content_type or BYTES_CONTENT_TYPE
    else:
        if content_type is not None and content_type != JSON_CONTENT_TYPE:
            raise InvalidMessageError(
                f"content_type {content_type!r} needs the message as bytes; "
                "a non-bytes message is sent as JSON"
            )
        doc["body"] = message
    try:
        payload = _dumps(doc)
    except (TypeError, ValueError, RecursionError) as exc:
        # ValueError covers NaN/Infinity, circular references and lone surrogates.
        raise InvalidMessageError(f"message is not JSON-serialisable: {exc}") from exc
    return Entry(message_id=message_id, destination=dest, payload=payload, key=key)
