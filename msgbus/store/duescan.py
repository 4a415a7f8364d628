"""`DueScan`: the deliveries of a subscription in one status (failed: retries; scheduled:
delayed deliveries) whose next attempt is due, oldest due first, read in time windows instead
of one query over everything due. Each status is its own range of the (subscription, status,
next_attempt_at) index, so what waits beyond now (a million delayed messages) is never read.

Why: a claim must read what it takes, not the whole backlog of due retries, whether or not the
server stops an index scan at a query's limit; a window `floor <= next_attempt_at < floor +
width` holds only what lies in it. On a server whose scan stops at the limit, one sorted query
with a limit would do; why the windows were needed, and what MongoDB could use instead:
docs/decisions.md, "Due retries read in time windows".

The floor is the time below which nothing is due. A full scan finds it (the oldest due entry)
once per `rescan_s`; in between, the floor moves up over windows found empty. Every writer sets
`next_attempt_at` to its own "now" or later (a failure's backoff, a lease, a release, a sweep,
a re-drive), so nothing lands below a floor that stays `margin_s` behind the clock, with two
exceptions that the periodic full scan catches: clocks further apart than the margin, and a
failure recorded later than the margin after it happened (a dispatcher's trace held back while
MongoDB was down). Such a retry is then at most `rescan_s` late; none is lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.collection import AsyncCollection

from msgbus.models import DeliveryStatus

FIRST_WINDOW_S = 1.0
MIN_WINDOW_S = 0.001
MARGIN_S = 60.0
RESCAN_S = 60.0
# A window's query may read every entry of its range whatever its limit (see the module's
# docstring): in a dense stretch (a sweep's or a re-drive's thousands due at one instant) each
# claim would read all that is left. So a window returns up to this many times what was asked,
# and the rest serves the next claims, while it is fresh: an id handed out stale only makes a
# smaller claim (the claim checks again that it is due).
AHEAD_FACTOR = 8
AHEAD_TTL_S = 5.0


@dataclass(slots=True)
class _Floor:
    at: datetime  # nothing of the subscription is due before this
    scanned_at: float  # monotonic time of the full scan it descends from
    window_s: float  # the width of the first window of the next scan
    ahead: list[str] = field(default_factory=list)  # due ids found beyond the last claim
    ahead_at: float = 0.0  # monotonic time they were found

    def take_ahead(self, limit: int, ttl_s: float) -> list[str]:
        if time.monotonic() - self.ahead_at > ttl_s:
            self.ahead = []
        taken, self.ahead = self.ahead[:limit], self.ahead[limit:]
        return taken


class DueScan:
    def __init__(self, deliveries: AsyncCollection[dict[str, Any]], *,
                 status: DeliveryStatus = DeliveryStatus.FAILED,
                 margin_s: float = MARGIN_S, rescan_s: float = RESCAN_S) -> None:
        self._deliveries = deliveries
        self._status = status.value
        self._margin = timedelta(seconds=margin_s)
        self._rescan_s = rescan_s
        self._floors: dict[str, _Floor] = {}

    async def due_ids(self, subscription: str, now: datetime, limit: int) -> list[str]:
        """Up to `limit` ids of due deliveries of `subscription`, oldest due first."""
        floor = await self._floor(subscription, now)
        if floor is None:
            return []
        if ids := floor.take_ahead(limit, AHEAD_TTL_S):
            return ids
        lo, width_s = floor.at, floor.window_s
        verified = floor.at  # nothing is due below this: the windows up to here were empty
        while len(ids) < limit:
            hi = min(lo + timedelta(seconds=width_s), now)
            wanted = limit - len(ids)
            found = await self._window(subscription, lo, hi, last=hi >= now,
                                       limit=wanted * AHEAD_FACTOR)
            if not found and verified == lo:
                verified = hi
            ids += found[:wanted]
            if len(found) > wanted:
                floor.ahead, floor.ahead_at = found[wanted:], time.monotonic()
            if len(found) >= wanted:  # dense: the next scan starts narrower
                floor.window_s = max(MIN_WINDOW_S, width_s / 4)
            if hi >= now:
                break
            if not found:
                width_s *= 4  # sparse: widen, so a long quiet stretch costs a few queries
            lo = hi
        floor.at = max(floor.at, min(verified, now - self._margin))
        if not ids:
            floor.window_s = self._idle_window_s(floor.at, now)
        return ids

    def _idle_window_s(self, floor_at: datetime, now: datetime) -> float:
        """Nothing due: the next scan is one query, from the floor to the clock (and the
        margin beyond, for the time passed until then)."""
        return (now - floor_at).total_seconds() + self._margin.total_seconds()

    async def _window(self, subscription: str, lo: datetime, hi: datetime, *, last: bool,
                      limit: int) -> list[str]:
        upper = "$lte" if last else "$lt"  # windows are half-open; the last one ends at now
        query = {"subscription": subscription, "status": self._status,
                 "next_attempt_at": {"$gte": lo, upper: hi}}
        cursor = self._deliveries.find(query, {"_id": 1}).sort("next_attempt_at", ASCENDING)
        return [d["_id"] async for d in cursor.limit(limit)]

    async def _floor(self, subscription: str, now: datetime) -> _Floor | None:
        """The subscription's floor, from a full scan when the last is `rescan_s` old; None
        when that scan found nothing due."""
        known = self._floors.get(subscription)
        if known is not None and time.monotonic() - known.scanned_at < self._rescan_s:
            return known
        oldest = await self._deliveries.find_one(
            {"subscription": subscription, "status": self._status,
             "next_attempt_at": {"$lte": now}},
            {"next_attempt_at": 1}, sort=[("next_attempt_at", ASCENDING)])
        at = now - self._margin
        if oldest is not None:
            at = min(at, oldest["next_attempt_at"])
        if oldest is None:
            window_s = self._idle_window_s(at, now)
        else:
            window_s = known.window_s if known else FIRST_WINDOW_S
        floor = _Floor(at, time.monotonic(), window_s)
        self._floors[subscription] = floor
        return None if oldest is None else floor
