"""Validating bodies against payload schemas: what a schema must be, the first error's JSON
pointer and keyword, one compile per version, the receiver's checks of a body's form, and the
version a body passed carried through the broker encoding and the record."""

from __future__ import annotations

from typing import Any

import pytest

from msgbus.codec import decode, encode
from msgbus.errors import InvalidConfig, InvalidMessage, UnsupportedMediaType
from msgbus.models import Envelope, PayloadSchema
from msgbus.payload_schema import CompiledSchemas, SchemaViolation, compile_schema, first_error
from msgbus.store import documents as docs
from receiver.validation import BodyValidator, is_json_media_type

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "tags": {"type": "array", "items": {
        "type": "object", "properties": {"a/b": {"type": "integer"}}}}},
    "required": ["id"],
}


@pytest.mark.parametrize("schema", [{"type": "strin"}, {"minimum": "zero"},
                                    {"$schema": "http://json-schema.org/draft-07/schema#"}])
def test_a_schema_that_is_not_draft_2020_12_is_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfig) as raised:
        compile_schema(schema)
    assert raised.value.field == "schema"


def test_the_first_error_names_its_pointer_and_keyword() -> None:
    validator = compile_schema(SCHEMA)
    assert first_error(validator, {"id": "x", "tags": [{"a/b": 1}]}) is None
    missing = first_error(validator, {})
    assert missing is not None and (missing.pointer, missing.keyword) == ("", "required")
    nested = first_error(validator, {"id": "x", "tags": [{"a/b": 1}, {"a/b": "one"}]})
    assert nested is not None and (nested.pointer, nested.keyword) == ("/tags/1/a~1b", "type")
    nothing = first_error(compile_schema(False), 1)
    assert nothing is not None and nothing.keyword == "false"


def test_each_version_is_compiled_once_and_a_new_one_replaces_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[Any] = []
    real = compile_schema
    monkeypatch.setattr("msgbus.payload_schema.compile_schema",
                        lambda schema: compiled.append(schema) or real(schema))
    cache = CompiledSchemas()
    for _ in range(3):
        cache.check("orders", 1, SCHEMA, {"id": "x"})
    cache.check("orders", 2, True, 5)
    assert compiled == [SCHEMA, True]
    with pytest.raises(SchemaViolation) as raised:
        cache.check("orders", 1, SCHEMA, {"id": 1})
    body = raised.value.to_json()
    assert (body["error"], body["pointer"], body["keyword"], body["schema_version"]) == (
        "schema_violation", "/id", "type", 1)
    assert raised.value.status_code == 422


class _Registry:
    def __init__(self, schema: PayloadSchema | None) -> None:
        self.schema = schema

    def payload_schema(self, code: str) -> PayloadSchema | None:
        return self.schema


def _envelope(body: bytes, content_type: str = "application/json") -> Envelope:
    return Envelope(message_id="m", destination="orders", body=body, content_type=content_type)


def test_the_receiver_stamps_the_version_and_refuses_what_is_not_json() -> None:
    schema = PayloadSchema(destination="orders", version=4, schema=SCHEMA)
    validator = BodyValidator(_Registry(schema))  # type: ignore[arg-type]
    envelope = _envelope(b'{"id": "x"}', "application/vnd.order+json; charset=utf-8")
    validator.check(envelope)
    assert envelope.schema_version == 4
    with pytest.raises(UnsupportedMediaType):
        validator.check(_envelope(b"\x89PNG", "image/png"))
    with pytest.raises(InvalidMessage, match="not valid JSON"):
        validator.check(_envelope(b"{nope"))
    with pytest.raises(SchemaViolation):
        validator.check(_envelope(b"{}"), {"id": 5})  # the parsed body is what is checked
    unchecked = _envelope(b"\x89PNG", "image/png")
    BodyValidator(_Registry(None)).check(unchecked)  # type: ignore[arg-type]
    assert unchecked.schema_version is None
    assert is_json_media_type("Application/JSON") and not is_json_media_type("text/json5")


def test_the_version_travels_through_the_encoding_and_into_the_record() -> None:
    envelope = _envelope(b"{}")
    envelope.schema_version = 7
    assert decode(encode(envelope)).schema_version == 7
    assert decode(encode(_envelope(b"{}"))).schema_version is None
    doc = docs.message_doc(envelope, [])
    assert doc["schema_version"] == 7
    assert docs.envelope_from_doc(doc).schema_version == 7


def test_a_schema_that_cannot_be_stored_is_refused_with_its_reason() -> None:
    """Found by the API fuzzing: an integer beyond 64 bits was a 500, not a 422."""
    schema = PayloadSchema(destination="orders", version=1,
                           schema={"type": "integer", "maximum": -65560484483161071616})
    with pytest.raises(InvalidConfig, match="cannot be stored") as refused:
        docs.schema_doc(schema)
    assert refused.value.field == "schema"
