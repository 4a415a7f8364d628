"""The compatibility rules of payload schema versions (docs/schemas.md): what each mode lets a
new version change, and the reason given for what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from admin.schema_compat import incompatibilities, schema_changes
from msgbus.models import SchemaCompatibility as Mode

ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "amount": {"type": "number"},
                   "status": {"enum": ["new", "paid"]}},
    "required": ["id"],
}


def _with(**changes: Any) -> dict[str, Any]:
    return ORDER | changes


def _props(**changes: Any) -> dict[str, Any]:
    return _with(properties=ORDER["properties"] | changes)


def _messages(old: Any, new: Any, mode: Mode) -> list[str]:
    return [c.message for c in incompatibilities(old, new, mode)]


def _allowed(old: Any, new: Any) -> set[str]:
    """The modes that accept the change from `old` to `new`."""
    return {m.value for m in Mode if not incompatibilities(old, new, m)}


ALL = {"none", "backward", "forward", "full"}


def test_an_unchanged_schema_and_annotations_are_compatible_in_every_mode() -> None:
    assert _allowed(ORDER, dict(ORDER)) == ALL
    assert _allowed(ORDER, _with(title="Order", description="an order", examples=[{}])) == ALL
    assert schema_changes(ORDER, _props(id={"type": "string", "description": "its id"})) == []


def test_a_new_required_field_breaks_backward_with_a_reason() -> None:
    new = _with(required=["id", "amount"])
    assert _messages(ORDER, new, Mode.BACKWARD) == ["field `amount` became required"]
    assert _allowed(ORDER, new) == {"none", "forward"}
    [change] = incompatibilities(ORDER, new, Mode.FULL)
    assert change.path == "/required"
    assert change.to_json()["breaks"] == ["backward"]


def test_a_field_no_longer_required_breaks_forward() -> None:
    new = _with(required=[])
    assert _messages(ORDER, new, Mode.FORWARD) == ["field `id` is no longer required"]
    assert _allowed(ORDER, new) == {"none", "backward"}


def test_adding_an_optional_field_to_an_open_schema_is_fully_compatible() -> None:
    assert _allowed(ORDER, _props(note={"type": "string"})) == ALL


def test_adding_a_field_where_unknown_fields_were_refused_breaks_forward() -> None:
    closed = _with(additionalProperties=False)
    new = closed | {"properties": ORDER["properties"] | {"note": {"type": "string"}}}
    assert _allowed(closed, new) == {"none", "backward"}
    assert "field `note` was added" in _messages(closed, new, Mode.FORWARD)[0]


def test_removing_a_field_is_allowed_only_while_unknown_fields_are() -> None:
    props = {k: v for k, v in ORDER["properties"].items() if k != "amount"}
    assert _allowed(ORDER, _with(properties=props)) == ALL
    closed_new = _with(properties=props, additionalProperties=False)
    messages = _messages(ORDER, closed_new, Mode.BACKWARD)
    assert any("field `amount` was removed" in m for m in messages)
    assert "backward" not in _allowed(ORDER, closed_new)


def test_closing_or_opening_the_schema() -> None:
    closed = _with(additionalProperties=False)
    assert _allowed(ORDER, closed) == {"none", "forward"}
    assert _allowed(closed, ORDER) == {"none", "backward"}
    assert _messages(ORDER, closed, Mode.BACKWARD) == [
        "a field not named in `properties` is no longer accepted at all"]
    nested = {"type": "object", "properties": {"customer": ORDER}}
    nested_closed = {"type": "object", "properties": {"customer": closed}}
    assert _messages(nested, nested_closed, Mode.BACKWARD) == [
        "a field not named in `properties` of `customer` is no longer accepted at all"]


def test_additional_properties_as_a_schema_is_compared_as_one() -> None:
    strings = _with(additionalProperties={"type": "string"})
    anything = _with(additionalProperties={"type": ["string", "number"]})
    assert _allowed(strings, anything) == {"none", "backward"}
    # a field added under an additionalProperties schema: compared with that schema
    added = strings | {"properties": ORDER["properties"] | {"n": {"type": "integer"}}}
    assert _allowed(strings, added) == {"none"}


def test_narrowing_a_type_breaks_backward_and_widening_breaks_forward() -> None:
    narrowed = _props(amount={"type": "integer"})
    assert _messages(ORDER, narrowed, Mode.BACKWARD) == [
        "type of field `amount` no longer allows number"]
    assert _allowed(ORDER, narrowed) == {"none", "forward"}
    widened = _props(amount={"type": ["number", "null"]})
    assert _messages(ORDER, widened, Mode.FORWARD) == [
        "type of field `amount` now also allows null"]
    assert _allowed(ORDER, widened) == {"none", "backward"}
    # integer -> number widens only
    assert _allowed(_props(amount={"type": "integer"}), ORDER) == {"none", "backward"}


def test_enum_values_removed_break_backward_and_added_break_forward() -> None:
    fewer = _props(status={"enum": ["new"]})
    assert _messages(ORDER, fewer, Mode.BACKWARD) == [
        'field `status` no longer allows the values "paid"']
    more = _props(status={"enum": ["new", "paid", "refunded"]})
    assert _messages(ORDER, more, Mode.FORWARD) == [
        'field `status` now also allows the values "refunded"']
    assert _allowed(ORDER, _props(status={"const": "new"})) == {"none", "forward"}
    assert _allowed(ORDER, _props(status={})) == {"none", "backward"}


def test_nested_objects_are_compared_field_by_field() -> None:
    old = {"type": "object", "properties": {"customer": {
        "type": "object", "properties": {"email": {"type": "string"}}}}}
    new = {"type": "object", "properties": {"customer": {
        "type": "object", "properties": {"email": {"type": "string"}},
        "required": ["email"]}}}
    assert _messages(old, new, Mode.BACKWARD) == ["field `customer.email` became required"]
    [change] = incompatibilities(old, new, Mode.BACKWARD)
    assert change.path == "/properties/customer/required"


def test_array_items_are_compared() -> None:
    old = {"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "qty": {"type": "integer"}}}}
    new = {"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}}}
    assert _messages(old, new, Mode.BACKWARD) == [
        "`minimum` of field `[].qty` tightened (none -> 1)"]
    assert _allowed(old, new) == {"none", "forward"}
    assert _allowed(old, old | {"maxItems": 10}) == {"none", "forward"}
    assert _allowed(old | {"maxItems": 10}, old | {"maxItems": 20}) == {"none", "backward"}
    assert _allowed(old, old | {"uniqueItems": True}) == {"none", "forward"}
    # items left out accept anything
    assert _allowed({"type": "array"}, old) == {"none", "forward"}


def test_bounds() -> None:
    base = {"type": "string", "maxLength": 10}
    assert _allowed(base, base | {"maxLength": 5}) == {"none", "forward"}
    assert _allowed(base, {"type": "string"}) == {"none", "backward"}
    assert _allowed(base, base | {"minLength": 1}) == {"none", "forward"}


@pytest.mark.parametrize("keyword, before, after", [
    ("pattern", "^a", "^b"),
    ("$ref", "#/$defs/a", "#/$defs/b"),
    ("allOf", [{"type": "object"}], [{"type": "object"}, {"required": ["x"]}]),
    ("oneOf", None, [{"type": "string"}]),
    ("patternProperties", None, {"^x": {"type": "string"}}),
])
def test_what_cannot_be_proven_compatible_is_reported_as_incompatible(
        keyword: str, before: Any, after: Any) -> None:
    old = ORDER if before is None else ORDER | {keyword: before}
    new = ORDER | {keyword: after}
    assert _allowed(old, new) == {"none"}
    [change] = schema_changes(old, new)
    assert f"`{keyword}`" in change.message and "cannot prove" in change.message


def test_boolean_schemas() -> None:
    assert _allowed(True, ORDER) == {"none", "forward"}
    assert _allowed(ORDER, True) == {"none", "backward"}
    assert _allowed(True, False) == {"none", "forward"}
    assert _allowed(False, ORDER) == {"none", "backward"}
    assert _allowed(_props(amount=True), _props(amount=False)) == {"none", "forward"}


def test_none_allows_anything() -> None:
    assert incompatibilities(ORDER, {"type": "string"}, Mode.NONE) == []
    assert _allowed(ORDER, {"type": "string"}) == {"none"}
