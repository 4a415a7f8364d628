"""Delayed delivery in tests and benchmarks: how late each push came after its due time."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from msgbus_devtools.testkit.subscriber import Push


def wall_time(push: Push) -> datetime:
    """When the push arrived, on the wall clock (Push.at is monotonic)."""
    return datetime.fromtimestamp(time.time() - (time.monotonic() - push.at), UTC)


def lateness_s(pushes: list[Push], due: dict[str, datetime]) -> dict[str, float]:
    """Per message of `due`, how late its first push came after its due time (negative:
    early)."""
    first: dict[str, datetime] = {}
    for push in pushes:
        if push.message_id not in due:
            continue
        at = wall_time(push)
        if push.message_id not in first or at < first[push.message_id]:
            first[push.message_id] = at
    return {m: (first[m] - due[m]).total_seconds() for m in first}

