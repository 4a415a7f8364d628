"""Whether a new version of a destination's JSON Schema is compatible with the one before it:
a pure, structural comparison of two schemas (docs/schemas.md has the rules and why).

`schema_changes(old, new)` lists every change that alters which bodies a schema accepts, each
marked as *narrowing* (some body the old schema accepts is refused by the new one: consumers on
the new schema cannot read all old data, so it breaks `backward`) and/or *widening* (some body
the new schema accepts is refused by the old one: consumers still on the old schema cannot read
all new data, so it breaks `forward`). `incompatibilities(old, new, mode)` keeps the ones that
break `mode`. A change this module cannot reason about (keywords compared only for equality,
such as `$ref`, `allOf` or `pattern`) is marked as both, with a reason that says so: nothing is
called compatible that is not proven so, under one stated convention (a property that an open
schema does not name is not sent by producers: Nakadi's `compatible` mode relies on the same).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from msgbus.models import SchemaCompatibility

JSON_TYPES = ("null", "boolean", "object", "array", "number", "string")
# keywords that never change which bodies a schema accepts; `format` is one too, since msgbus
# validates with formats as annotations (draft 2020-12's default; msgbus/payload_schema.py)
ANNOTATIONS = frozenset({"title", "description", "examples", "default", "$comment",
                         "deprecated", "readOnly", "writeOnly", "$schema", "$id", "format"})
# keywords compared structurally below; every other one is compared for equality
HANDLED = frozenset({"type", "enum", "const", "required", "properties",
                     "additionalProperties", "items", "uniqueItems"})
LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")


@dataclass(frozen=True, slots=True)
class Change:
    """One change between two versions. `path` is a JSON pointer into the schema."""

    path: str
    message: str
    narrows: bool  # breaks backward: old data may be refused by the new schema
    widens: bool  # breaks forward: new data may be refused by the old schema

    def breaks(self, mode: SchemaCompatibility) -> bool:
        if mode is SchemaCompatibility.BACKWARD:
            return self.narrows
        if mode is SchemaCompatibility.FORWARD:
            return self.widens
        if mode is SchemaCompatibility.FULL:
            return self.narrows or self.widens
        return False

    def to_json(self) -> dict[str, Any]:
        breaks = [m.value for m in (SchemaCompatibility.BACKWARD, SchemaCompatibility.FORWARD)
                  if self.breaks(m)]
        return {"path": self.path, "message": self.message, "breaks": breaks}


def incompatibilities(old: Any, new: Any, mode: SchemaCompatibility) -> list[Change]:
    """The changes from `old` to `new` that `mode` does not allow (none for `none`)."""
    if mode is SchemaCompatibility.NONE:
        return []
    return [change for change in schema_changes(old, new) if change.breaks(mode)]


def schema_changes(old: Any, new: Any) -> list[Change]:
    """Every change from `old` to `new` that alters which bodies are accepted."""
    return list(_diff(old, new, "", ""))


def _what(where: str) -> str:
    if where.endswith("*"):  # what additionalProperties governs
        owner = where[:-1].rstrip(".")
        return "a field not named in `properties`" + (f" of `{owner}`" if owner else "")
    return f"field `{where}`" if where else "the body"


def _child(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _pointer(path: str, *parts: str) -> str:
    escaped = (p.replace("~", "~0").replace("/", "~1") for p in parts)
    return "/".join((path, *escaped))


def _diff(old: Any, new: Any, path: str, where: str) -> Iterator[Change]:
    if old == new:
        return
    if isinstance(old, bool) or isinstance(new, bool):
        yield from _diff_boolean(old, new, path, where)
        return
    if not isinstance(old, dict) or not isinstance(new, dict):
        yield Change(path or "/", f"{_what(where)}: a schema must be an object or a boolean",
                     True, True)
        return
    for compare in _COMPARISONS:
        yield from compare(old, new, path, where)


def _diff_boolean(old: Any, new: Any, path: str, where: str) -> Iterator[Change]:
    """`true` accepts everything, `false` nothing; `true` is the empty schema `{}`."""
    if old is True or new is True:
        yield from _diff({} if old is True else old, {} if new is True else new, path, where)
    elif new is False:
        yield Change(path or "/", f"{_what(where)} is no longer accepted at all", True, False)
    else:  # old is False
        yield Change(path or "/", f"{_what(where)} was refused and is now accepted", False, True)


def _types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if declared is None:
        return set(JSON_TYPES)
    return {declared} if isinstance(declared, str) else set(declared)


def _covered(kind: str, types: set[str]) -> bool:
    return kind in types or (kind == "integer" and "number" in types)


def _compare_type(old: dict[str, Any], new: dict[str, Any], path: str,
                  where: str) -> Iterator[Change]:
    before, after = _types(old), _types(new)
    lost = sorted(t for t in before if not _covered(t, after))
    gained = sorted(t for t in after if not _covered(t, before))
    yield from _narrowed_and_widened(
        _pointer(path, "type"),
        f"type of {_what(where)} no longer allows {', '.join(lost)}" if lost else "",
        f"type of {_what(where)} now also allows {', '.join(gained)}" if gained else "")


def _narrowed_and_widened(at: str, narrowed: str, widened: str) -> Iterator[Change]:
    """A change that refuses what was taken (`narrowed`, when not empty) and one that takes
    what was refused (`widened`)."""
    if narrowed:
        yield Change(at, narrowed, True, False)
    if widened:
        yield Change(at, widened, False, True)


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _allowed_values(schema: dict[str, Any]) -> dict[bytes, Any] | None:
    """The values `enum`/`const` allow, by canonical JSON; None: no such limit."""
    values: dict[bytes, Any] | None = None
    if isinstance(schema.get("enum"), list):
        values = {_canonical(v): v for v in schema["enum"]}
    if "const" in schema:
        const = {_canonical(schema["const"]): schema["const"]}
        values = const if values is None else {k: v for k, v in values.items() if k in const}
    return values


def _compare_enum(old: dict[str, Any], new: dict[str, Any], path: str,
                  where: str) -> Iterator[Change]:
    before, after = _allowed_values(old), _allowed_values(new)
    at = _pointer(path, "enum")
    if before == after:
        return
    if before is None and after is not None:
        yield Change(at, f"{_what(where)} is now limited to the values "
                         f"{_listing(after.values())}", True, False)
    elif after is None:
        yield Change(at, f"{_what(where)} is no longer limited to a list of values",
                     False, True)
    elif before is not None:
        lost = [v for k, v in before.items() if k not in after]
        gained = [v for k, v in after.items() if k not in before]
        yield from _narrowed_and_widened(
            at, f"{_what(where)} no longer allows the values {_listing(lost)}" if lost else "",
            f"{_what(where)} now also allows the values {_listing(gained)}" if gained else "")


def _listing(values: Any) -> str:
    return ", ".join(orjson.dumps(v).decode() for v in values)


def _compare_required(old: dict[str, Any], new: dict[str, Any], path: str,
                      where: str) -> Iterator[Change]:
    before, after = set(old.get("required") or ()), set(new.get("required") or ())
    at = _pointer(path, "required")
    for name in sorted(after - before):
        yield Change(at, f"field `{_child(where, name)}` became required", True, False)
    for name in sorted(before - after):
        yield Change(at, f"field `{_child(where, name)}` is no longer required", False, True)


def _extra(schema: dict[str, Any]) -> Any:
    """What a schema says of the properties it does not name."""
    return schema.get("additionalProperties", True)


def _compare_properties(old: dict[str, Any], new: dict[str, Any], path: str,
                        where: str) -> Iterator[Change]:
    before, after = old.get("properties") or {}, new.get("properties") or {}
    for name in sorted(set(before) | set(after)):
        at, field = _pointer(path, "properties", name), _child(where, name)
        if name in before and name in after:
            yield from _diff(before[name], after[name], at, field)
        elif name in after:
            yield from _added_property(_extra(old), after[name], at, field)
        else:
            yield from _removed_property(before[name], _extra(new), at, field)


def _added_property(old_extra: Any, schema: Any, at: str, field: str) -> Iterator[Change]:
    if old_extra is False:
        yield Change(at, f"field `{field}` was added where the old schema refused unknown "
                         "fields (additionalProperties: false)", False, True)
    elif isinstance(old_extra, dict):
        yield from _diff(old_extra, schema, at, field)
    # an open old schema: by convention its producers never sent an undeclared property


def _removed_property(schema: Any, new_extra: Any, at: str, field: str) -> Iterator[Change]:
    if new_extra is False:
        yield Change(at, f"field `{field}` was removed and the new schema refuses unknown "
                         "fields (additionalProperties: false)", True, False)
    elif isinstance(new_extra, dict):
        yield from _diff(schema, new_extra, at, field)


def _compare_additional(old: dict[str, Any], new: dict[str, Any], path: str,
                        where: str) -> Iterator[Change]:
    yield from _diff(_extra(old), _extra(new), _pointer(path, "additionalProperties"),
                     _child(where, "*"))


def _compare_items(old: dict[str, Any], new: dict[str, Any], path: str,
                   where: str) -> Iterator[Change]:
    yield from _diff(old.get("items", True), new.get("items", True), _pointer(path, "items"),
                     f"{where}[]")


def _compare_unique(old: dict[str, Any], new: dict[str, Any], path: str,
                    where: str) -> Iterator[Change]:
    before, after = bool(old.get("uniqueItems")), bool(new.get("uniqueItems"))
    if after and not before:
        yield Change(_pointer(path, "uniqueItems"), f"{_what(where)} must now hold unique "
                                                     "items", True, False)
    elif before and not after:
        yield Change(_pointer(path, "uniqueItems"), f"{_what(where)} may now hold repeated "
                                                     "items", False, True)


def _compare_bounds(old: dict[str, Any], new: dict[str, Any], path: str,
                    where: str) -> Iterator[Change]:
    for keyword, lower in [(k, True) for k in LOWER_BOUNDS] + [(k, False) for k in UPPER_BOUNDS]:
        before, after = old.get(keyword), new.get(keyword)
        if before == after:
            continue
        at = _pointer(path, keyword)
        if not all(v is None or isinstance(v, int | float) for v in (before, after)):
            yield Change(at, f"`{keyword}` of {_what(where)} is not a number", True, True)
        elif after is None:
            yield Change(at, f"{_what(where)} lost its `{keyword}` ({before})", False, True)
        elif before is None or (after > before) == lower:
            yield Change(at, f"`{keyword}` of {_what(where)} tightened "
                             f"({'none' if before is None else before} -> {after})", True, False)
        else:
            yield Change(at, f"`{keyword}` of {_what(where)} loosened ({before} -> {after})",
                         False, True)


def _compare_others(old: dict[str, Any], new: dict[str, Any], path: str,
                    where: str) -> Iterator[Change]:
    skip = ANNOTATIONS | HANDLED | set(LOWER_BOUNDS) | set(UPPER_BOUNDS)
    for keyword in sorted((set(old) | set(new)) - skip):
        if old.get(keyword) != new.get(keyword):
            yield Change(_pointer(path, keyword),
                         f"`{keyword}` of {_what(where)} changed; msgbus compares `{keyword}` "
                         "only for equality, so it cannot prove the change compatible",
                         True, True)


Comparison = Callable[[dict[str, Any], dict[str, Any], str, str], Iterator[Change]]
_COMPARISONS: tuple[Comparison, ...] = (
    _compare_type, _compare_enum, _compare_required, _compare_properties, _compare_additional,
    _compare_items, _compare_unique, _compare_bounds, _compare_others)
