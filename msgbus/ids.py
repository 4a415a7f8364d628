"""Time-ordered message ids (UUIDv7, RFC 9562) and their validation."""

import os
import re
import time
import uuid
from datetime import UTC, datetime

_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def uuid7() -> str:
    """A new UUIDv7 string: 48-bit unix milliseconds, then random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= (rand >> 68 & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


def is_message_id(value: object) -> bool:
    """True for a lower-case canonical UUID string (any version; v7 is what clients send)."""
    return isinstance(value, str) and _UUID_RE.fullmatch(value) is not None


def uuid7_time(message_id: str) -> datetime:
    """The creation time encoded in a UUIDv7."""
    ms = uuid.UUID(message_id).int >> 80
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
