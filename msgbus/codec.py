"""Binary encoding of an Envelope for brokers and local buffers.

Layout: b"MB1" | 4-byte big-endian length of the metadata | orjson metadata | raw body.
The body is never re-encoded, so opaque bytes and JSON travel the same way.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from msgbus.errors import InvalidMessage
from msgbus.models import Envelope

_MAGIC = b"MB1"
_LEN = struct.Struct(">I")


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def _dt(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1000, tz=UTC)


def encode(envelope: Envelope) -> bytes:
    meta: dict[str, Any] = {
        "id": envelope.message_id,
        "d": envelope.destination,
        "ct": envelope.content_type,
        "t": _ms(envelope.created_at),
    }
    if envelope.biz_id is not None:
        meta["b"] = envelope.biz_id
    if envelope.source_app is not None:
        meta["a"] = envelope.source_app
    if envelope.received_at is not None:
        meta["r"] = _ms(envelope.received_at)
    if envelope.headers:
        meta["h"] = envelope.headers
    if envelope.traceparent is not None:
        meta["tp"] = envelope.traceparent
        if envelope.tracestate is not None:
            meta["ts"] = envelope.tracestate
    if envelope.redelivered:
        meta["rd"] = 1
    if envelope.schema_version is not None:
        meta["sv"] = envelope.schema_version
    if envelope.deliver_at is not None:
        meta["da"] = _ms(envelope.deliver_at)
    head = orjson.dumps(meta)
    return b"".join((_MAGIC, _LEN.pack(len(head)), head, envelope.body))


def decode(data: bytes) -> Envelope:
    if data[:3] != _MAGIC or len(data) < 7:
        raise InvalidMessage("not an msgbus envelope (bad magic)")
    (size,) = _LEN.unpack_from(data, 3)
    meta = orjson.loads(data[7 : 7 + size])
    created = _dt(meta["t"])
    if created is None:
        raise InvalidMessage("an msgbus envelope without its creation time")
    return Envelope(
        message_id=meta["id"],
        destination=meta["d"],
        body=data[7 + size :],
        content_type=meta["ct"],
        biz_id=meta.get("b"),
        source_app=meta.get("a"),
        created_at=created,
        received_at=_dt(meta.get("r")),
        headers=meta.get("h") or {},
        traceparent=meta.get("tp"),
        tracestate=meta.get("ts"),
        redelivered=bool(meta.get("rd")),
        schema_version=meta.get("sv"),
        deliver_at=_dt(meta.get("da")),
    )


# Envelopes decoded between two yields to the event loop by `decode_cooperatively`: about
# 0.1 ms of work, so that a large batch never stalls the requests served by the same loop.
DECODE_CHUNK = 64


async def decode_cooperatively(entries: Sequence[bytes]) -> list[Envelope]:
    """`decode` of every entry, yielding to the event loop between chunks."""
    out: list[Envelope] = []
    for start in range(0, len(entries), DECODE_CHUNK):
        if start:
            await asyncio.sleep(0)
        out += map(decode, entries[start : start + DECODE_CHUNK])
    return out


def encode_batch(envelopes: list[Envelope]) -> bytes:
    """Several envelopes in one body: each as a 4-byte length and its encoding."""
    parts: list[bytes] = []
    for envelope in envelopes:
        data = encode(envelope)
        parts += (_LEN.pack(len(data)), data)
    return b"".join(parts)


def decode_batch(data: bytes) -> list[Envelope]:
    out: list[Envelope] = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise InvalidMessage("truncated envelope batch")
        (size,) = _LEN.unpack_from(data, pos)
        pos += 4
        if pos + size > len(data):
            raise InvalidMessage("truncated envelope batch")
        out.append(decode(data[pos : pos + size]))
        pos += size
    return out
