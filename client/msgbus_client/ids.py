"""Client-generated message ids (UUIDv7, RFC 9562) and RFC 3339 timestamps.

Ids from one process are strictly increasing even within one millisecond or when the wall clock
steps back (the 74 bits after the timestamp act as a randomly seeded counter), so the spool, which
is keyed by id, keeps messages in send order.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from datetime import UTC, datetime

_MS_MASK = (1 << 48) - 1
_TAIL_BITS = 74  # 12 bits rand_a + 62 bits rand_b
_TAIL_MAX = (1 << _TAIL_BITS) - 1

_lock = threading.Lock()
_last_ms = -1
_last_tail = 0


def _compose(ms: int, tail: int) -> int:
    value = (ms & _MS_MASK) << 80
    value |= 0x7 << 76  # version 7
    value |= (tail >> 62) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # RFC 9562 variant
    value |= tail & ((1 << 62) - 1)  # rand_b
    return value


def uuid7(unix_ms: int | None = None) -> str:
    """A new UUIDv7 as a lower-case canonical string, greater than every earlier one."""
    return uuid7_with_key(unix_ms)[0]


def uuid7_with_key(unix_ms: int | None = None) -> tuple[str, bytes]:
    """A new UUIDv7: its canonical string and its 16 bytes (the spool key), made together
    because send() needs both and formatting is on its hot path."""
    global _last_ms, _last_tail
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    # drawn before taking the lock: nothing in the critical section may release the GIL, or
    # concurrent senders pile up on the lock. `random` is re-seeded in forked children, and ids
    # need uniqueness, not secrecy.
    fresh = random.getrandbits(_TAIL_BITS - 1)  # top bit clear: room to count up
    with _lock:
        if ms > _last_ms:
            tail = fresh
        else:
            ms = _last_ms
            tail = _last_tail + 1 + (fresh & 0xFFFF)
            if tail > _TAIL_MAX:
                ms += 1
                tail = fresh
        _last_ms, _last_tail = ms, tail
    value = _compose(ms, tail)
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}", value.to_bytes(16, "big")


def uuid7_unix_ms(message_id: str) -> int:
    """The unix milliseconds encoded in a UUIDv7."""
    return uuid.UUID(message_id).int >> 80


_second_prefix: tuple[int, str] = (-1, "")


def rfc3339_ms(unix_ms: int) -> str:
    """`2026-11-21T10:00:00.123Z` for a unix time in milliseconds."""
    global _second_prefix
    second = unix_ms // 1000
    cached_second, prefix = _second_prefix  # one tuple read: safe without a lock
    if cached_second != second:
        prefix = datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _second_prefix = (second, prefix)
    return f"{prefix}{unix_ms % 1000:03d}Z"


def now_ms() -> int:
    return time.time_ns() // 1_000_000
