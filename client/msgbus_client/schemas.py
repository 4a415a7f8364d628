"""Validating a message against its destination's payload schema before it is spooled
(`validate=True`), so that a body the receiver would refuse fails in the app with a clear
`SchemaValidationError`, not later in the spool's rejected list.

The schema comes from the receiver (`GET /v1/destinations/{code}/schema`, the version it
validates against) and is kept `schema_ttl_s`; a destination without a schema is remembered as
such for as long. When the schema cannot be fetched (the receiver is down), the last one known
is used, or the message goes unchecked: the receiver checks it anyway, and send() must not fail
for a network error. The validator is `jsonschema` (pure Python, the `validate` extra),
imported only when validation is on.

`SchemaCache` holds what both clients share; each client fetches with its own sender (the
blocking or the awaiting call).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from msgbus_client.errors import SchemaValidationError
from msgbus_client.message import Entry
from msgbus_client.protocol import PostResult

log = logging.getLogger("msgbus_client")

RETRY_FETCH_S = 5.0  # after a failed fetch, the next send() to that destination asks again


def load_validator_class() -> Any:
    try:
        from jsonschema import Draft202012Validator
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError("validate=True needs the jsonschema package: "
                          "pip install 'msgbus-client[validate]'") from exc
    return Draft202012Validator


@dataclass(frozen=True, slots=True)
class DestinationSchema:
    version: int
    validator: Any


def _pointer(parts: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class SchemaCache:
    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._validator_class = load_validator_class()
        # destination -> (fresh until, its schema or None for none)
        self._held: dict[str, tuple[float, DestinationSchema | None]] = {}

    def fresh(self, destination: str) -> tuple[bool, DestinationSchema | None]:
        """Whether a fetch is due, and the schema held (possibly stale)."""
        until, schema = self._held.get(destination, (0.0, None))
        return until <= time.monotonic(), schema

    @staticmethod
    def path(destination: str) -> str:
        return f"/v1/destinations/{quote(destination, safe='')}/schema"

    def remember(self, destination: str, answer: PostResult) -> DestinationSchema | None:
        """What the receiver's answer says of the destination's schema; kept for the TTL."""
        now = time.monotonic()
        held = self._held.get(destination, (0.0, None))[1]
        if answer.status == 200:
            try:
                found = json.loads(answer.body)
                if held is None or held.version != found["version"]:
                    held = DestinationSchema(found["version"],
                                             self._validator_class(found["schema"]))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("msgbus_client: unusable schema of %r: %s", destination, exc)
            self._held[destination] = (now + self._ttl_s, held)
        elif answer.status in (401, 403, 404):  # none, or the receiver refuses the send anyway
            held = None
            self._held[destination] = (now + self._ttl_s, None)
        else:
            log.warning("msgbus_client: cannot fetch the schema of %r (%s); %s", destination,
                        answer.status or answer.error,
                        "using the last one" if held else "not validating for now")
            self._held[destination] = (now + RETRY_FETCH_S, held)
        return held



def checked(entry: Entry, schema: DestinationSchema | None) -> Entry:
    """The entry, once its body passes `schema` (None: no schema); else SchemaValidationError."""
    if schema is not None:
        _check(entry, schema)
    return entry


def _check(entry: Entry, schema: DestinationSchema) -> None:
    doc = json.loads(entry.payload)
    body = doc["body"] if "body" in doc else _bytes_body(entry, doc, schema)
    error = next(iter(schema.validator.iter_errors(body)), None)
    if error is not None:
        pointer = _pointer(error.absolute_path)
        raise SchemaValidationError(
            f"the message breaks the schema (version {schema.version}) of "
            f"{entry.destination!r} at {pointer or '/'} ({error.validator}): {error.message}",
            destination=entry.destination, pointer=pointer, keyword=str(error.validator),
            version=schema.version)


def _bytes_body(entry: Entry, doc: dict[str, Any], schema: DestinationSchema) -> Any:
    """A message sent as bytes: its JSON value, when its content type says it is JSON (the
    receiver answers 415 for any other)."""
    content_type = str(doc.get("content_type", ""))
    media = content_type.split(";")[0].strip().lower()
    try:
        if media == "application/json" or media.endswith("+json"):
            return json.loads(base64.b64decode(doc["body_base64"]))
        reason = f"send JSON, not bytes of {content_type!r}"
    except ValueError as exc:
        reason = f"the bytes are declared {content_type!r} but are not JSON: {exc}"
    raise SchemaValidationError(
        f"destination {entry.destination!r} has a payload schema: {reason}",
        destination=entry.destination, pointer="", keyword="contentMediaType",
        version=schema.version)
