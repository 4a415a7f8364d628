"""MongoDB documents -> Arrow record batches of a given schema.

The MongoDB client hands out naive UTC datetimes (`tz_aware=False`); Arrow stores them as
`timestamp[us, tz=UTC]`, the only timestamp type Spark accepts from a Python data source.
A value of an unexpected type (a dict where a string is expected, a float in an integer column)
is converted instead of failing the whole read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa


def to_record_batch(documents: Sequence[Mapping[str, Any]], schema: pa.Schema,
                    extra_column: str | None = None) -> pa.RecordBatch:
    """One batch of `documents`; `extra_column` (if in the schema) receives, as JSON, every field
    that no other column holds."""
    known = {name for name in schema.names if name != extra_column}
    arrays = []
    for field in schema:
        if field.name == extra_column:
            values: list[Any] = [_extra_json(doc, known) for doc in documents]
        else:
            values = [doc.get(field.name) for doc in documents]
        arrays.append(_array(values, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _array(values: list[Any], kind: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return pa.array([_coerce(v, kind) for v in values], type=kind)


def _coerce(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    try:
        if pa.types.is_string(kind):
            return value if isinstance(value, str) else _json(value)
        if pa.types.is_integer(kind):
            return int(value)
        if pa.types.is_floating(kind):
            return float(value)
        if pa.types.is_boolean(kind):
            return bool(value)
        if pa.types.is_binary(kind):
            return bytes(value) if isinstance(value, bytes | bytearray) else _json(value).encode()
        if pa.types.is_list(kind) and isinstance(value, Iterable):
            return [_coerce(v, kind.value_type) for v in value]
    except (TypeError, ValueError, OverflowError):
        return None
    return value if pa.types.is_timestamp(kind) and hasattr(value, "year") else None


def _extra_json(document: Mapping[str, Any], known: set[str]) -> str | None:
    rest = {key: value for key, value in document.items() if key not in known}
    return _json(rest) if rest else None


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
