"""Turning a producer's JSON into an Envelope, with a clear error for every kind of bad input."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Any

import orjson

from msgbus.errors import InvalidInput, InvalidMessage, MessageTooLarge
from msgbus.ids import is_message_id
from msgbus.models import JSON_CONTENT_TYPE, Envelope

MAX_BIZ_ID_CHARS = 256
MAX_HEADERS = 64
_FIELDS = {"message_id", "biz_id", "created_at", "headers", "body", "body_base64",
           "content_type", "destination"}


def load_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from exc


def parse_envelope(
    data: Any, *, destination: str, source_app: str, max_body_bytes: int, now: datetime,
) -> Envelope:
    if not isinstance(data, dict):
        raise InvalidMessage("a message must be a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InvalidMessage(f"unknown field {unknown[0]!r}", field=unknown[0])
    message_id = data.get("message_id")
    if message_id is None:
        raise InvalidMessage("message_id is required (a UUIDv7 made by the client)",
                             field="message_id")
    if not is_message_id(message_id):
        raise InvalidMessage("message_id must be a lower-case canonical UUID string",
                             field="message_id")
    body, content_type = _parse_body(data)
    if len(body) > max_body_bytes:
        raise MessageTooLarge(f"message body is {len(body)} bytes; the limit is {max_body_bytes}",
                              field="body")
    return Envelope(
        message_id=message_id, destination=destination, body=body, content_type=content_type,
        biz_id=_parse_biz_id(data.get("biz_id")), source_app=source_app,
        created_at=_parse_created_at(data.get("created_at"), now), received_at=now,
        headers=_parse_headers(data.get("headers")),
    )


def _parse_body(data: dict[str, Any]) -> tuple[bytes, str]:
    has_body, has_b64 = "body" in data, "body_base64" in data
    if has_body == has_b64:
        raise InvalidMessage("exactly one of 'body' (JSON) or 'body_base64' is required",
                             field="body")
    if has_body:
        if data.get("content_type") not in (None, JSON_CONTENT_TYPE):
            raise InvalidMessage("'content_type' goes with 'body_base64'; 'body' is JSON",
                                 field="content_type")
        return orjson.dumps(data["body"]), JSON_CONTENT_TYPE
    content_type = data.get("content_type") or "application/octet-stream"
    if not isinstance(content_type, str) or "/" not in content_type:
        raise InvalidMessage("content_type must be a MIME type such as 'image/png'",
                             field="content_type")
    encoded = data["body_base64"]
    if not isinstance(encoded, str):
        raise InvalidMessage("body_base64 must be a base64 string", field="body_base64")
    try:
        return base64.b64decode(encoded, validate=True), content_type
    except (binascii.Error, ValueError) as exc:
        raise InvalidMessage(f"body_base64 is not valid base64: {exc}",
                             field="body_base64") from exc


def _parse_biz_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_BIZ_ID_CHARS:
        raise InvalidMessage(f"biz_id must be a string of 1..{MAX_BIZ_ID_CHARS} characters",
                             field="biz_id")
    return value


def _parse_created_at(value: Any, now: datetime) -> datetime:
    if value is None:
        return now
    if not isinstance(value, str):
        raise InvalidMessage("created_at must be an RFC 3339 string", field="created_at")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidMessage(f"created_at is not an RFC 3339 time: {value!r}",
                             field="created_at") from exc
    if parsed.tzinfo is None:
        raise InvalidMessage("created_at needs a time zone (e.g. a trailing 'Z')",
                             field="created_at")
    return parsed.astimezone(UTC)


def _parse_headers(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if (not isinstance(value, dict) or len(value) > MAX_HEADERS
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
        raise InvalidMessage(f"headers must be an object of at most {MAX_HEADERS} string values",
                             field="headers")
    return value
