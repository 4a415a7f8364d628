"""Validating each message's body against its destination's latest payload schema, before it
is accepted: an invalid body is a 422 naming the JSON pointer and the rule, a body that is not
JSON a 415. The schema comes from the registry (refreshed every `MSGBUS_CONFIG_REFRESH_S`), so
there is no MongoDB round trip per message; each version is compiled once.

A new version is enforced within a registry refresh of being registered: messages a receiver
takes meanwhile are checked against the version before (and record that version).
"""

from __future__ import annotations

from typing import Any

import orjson

from msgbus.errors import InvalidMessage, UnsupportedMediaType
from msgbus.models import JSON_CONTENT_TYPE, Envelope
from msgbus.payload_schema import CompiledSchemas
from msgbus.registry import Registry

NOT_PARSED: Any = object()  # the body has not been parsed yet


def is_json_media_type(content_type: str) -> bool:
    """application/json, or a JSON-based type such as application/cloudevents+json."""
    media = content_type.partition(";")[0].strip().lower()
    return media == JSON_CONTENT_TYPE or media.endswith("+json")


class BodyValidator:
    __slots__ = ("_compiled", "_registry")

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._compiled = CompiledSchemas()

    def check(self, envelope: Envelope, parsed_body: Any = NOT_PARSED) -> None:
        """Raises unless the envelope's body passes its destination's schema; stamps the
        version it passed on the envelope. `parsed_body`: the body as the request's JSON
        parse gave it, when it came as JSON (spares a second parse)."""
        schema = self._registry.payload_schema(envelope.destination)
        if schema is None:
            return
        if parsed_body is NOT_PARSED:
            parsed_body = self._parse(envelope)
        self._compiled.check(envelope.destination, schema.version, schema.schema_,
                             parsed_body)
        envelope.schema_version = schema.version

    @staticmethod
    def _parse(envelope: Envelope) -> Any:
        if not is_json_media_type(envelope.content_type):
            raise UnsupportedMediaType(
                f"destination {envelope.destination!r} has a payload schema: its messages are "
                f"JSON ('body', or body_base64 with a JSON content_type), not "
                f"{envelope.content_type[:100]!r}", field="content_type")
        try:
            return orjson.loads(envelope.body)
        except orjson.JSONDecodeError as exc:
            raise InvalidMessage(f"the body is declared {envelope.content_type!r} but is not "
                                 f"valid JSON: {exc}", field="body") from exc
