"""Which services see MongoDB as unavailable: the dashboard's Services panel and
`GET /v1/services` (viewer; `msgbus status`).

Every dispatcher, compensator and admin (their cap shares' heartbeat) and every receiver (its
beacon, receiver/beacon.py) advertises where its /health answers, in `instances`
(msgbus/store/shares.py). The admin keeps the last list it read (every LIST_REFRESH_S, and
when asked if older than FRESH_S, while its own gate is open), so it still knows where to look
while MongoDB is down; each ask reads every /health concurrently within POLL_TIMEOUT_S. A
process whose lease ended less than RECENT_S ago is still listed: one cut off from MongoDB
cannot renew it, yet it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from typing import Any

import httpx
from pymongo.errors import PyMongoError

from msgbus.errors import MongoUnavailable
from msgbus.models import utcnow
from msgbus.store import MongoStore
from msgbus.store.shares import ShareStore
from msgbus.tasks import PeriodicWork

LIST_TIMEOUT_S = 1.0
# above a service's own /health ping of MongoDB (1 s), which it waits for until its gate closes
POLL_TIMEOUT_S = 1.5
LIST_REFRESH_S = 10.0
FRESH_S = 2.0
RECENT_S = 300.0
COMPONENTS = ("receiver", "dispatcher", "compensator", "admin")  # the panel's order


def gate_view(state: Any) -> dict[str, Any] | None:
    """What the panel shows of a MongoDB gate's state (`MongoGate.state()`)."""
    if not isinstance(state, dict):
        return None
    return {k: state.get(k) for k in ("available", "since", "closed_by", "reason")}


def sees_unavailable(row: dict[str, Any]) -> bool:
    """The process, or its receiver's flush process, sees MongoDB as unavailable."""
    gates = [row.get("mongo"), (row.get("flusher") or {}).get("mongo")]
    return any(g is not None and not g.get("available") for g in gates)


def _order(row: dict[str, Any]) -> tuple[int, str]:
    component = row.get("component")
    rank = COMPONENTS.index(component) if component in COMPONENTS else len(COMPONENTS)
    return rank, str(row["instance"])


class ServiceDirectory(PeriodicWork):
    def __init__(self, store: MongoStore, *, own_instance: str,
                 own_health_url: str | None) -> None:
        super().__init__()
        self._shares = ShareStore(store)
        self._gate = store.gate
        self._own_instance = own_instance
        self._own_health_url = own_health_url
        self._instances: dict[str, dict[str, Any]] = {}
        self._read_at: datetime | None = None
        self._http = httpx.AsyncClient(timeout=POLL_TIMEOUT_S)
        self.every(LIST_REFRESH_S, self.refresh, what="services list",
                   ready=store.gate.wait_available)

    async def close(self) -> None:
        await super().close()
        await self._http.aclose()

    async def refresh(self) -> None:
        now = utcnow()
        async with self._gate.guard("services list", LIST_TIMEOUT_S):
            found = await self._shares.recent_instances(now, RECENT_S)
        self._instances, self._read_at = found, now

    async def status(self) -> dict[str, Any]:
        """Every service process known, as it sees MongoDB (the answer of GET /v1/services)."""
        stale = self._read_at is None or (utcnow() - self._read_at).total_seconds() > FRESH_S
        if stale and self._gate.available:
            with contextlib.suppress(MongoUnavailable, PyMongoError):  # the last list, then
                await self.refresh()
        others = [doc for name, doc in self._instances.items() if name != self._own_instance]
        rows = [self._own_row(), *await asyncio.gather(*(self._poll(doc) for doc in others))]
        rows.sort(key=_order)
        return {"mongo": self._gate.state(), "instances_read_at": self._read_at,
                "services": rows,
                "unavailable": [r["instance"] for r in rows if sees_unavailable(r)],
                "unreachable": [r["instance"] for r in rows if r["reachable"] is False]}

    def _own_row(self) -> dict[str, Any]:
        return {"instance": self._own_instance, "component": "admin",
                "health_url": self._own_health_url, "this_admin": True, "reachable": True,
                "error": None, "mongo": gate_view(self._gate.state()), "flusher": None}

    async def _poll(self, doc: dict[str, Any]) -> dict[str, Any]:
        url = doc.get("health_url")
        row: dict[str, Any] = {
            "instance": doc["_id"], "component": doc.get("component"), "health_url": url,
            "heartbeat_at": doc.get("heartbeat_at"), "lease_expires_at": doc.get("expires_at"),
            "reachable": None, "error": None, "mongo": None, "flusher": None}
        if not url:
            return row | {"error": "no health URL advertised"}
        try:
            response = await asyncio.wait_for(self._http.get(url), POLL_TIMEOUT_S)
            response.raise_for_status()
            health = response.json()
        except (httpx.HTTPError, TimeoutError, ValueError) as exc:
            return row | {"reachable": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
        # "drainer": a receiver from before 0.2 (in a rolling upgrade)
        flusher = health.get("flusher", health.get("drainer"))
        if isinstance(flusher, dict):
            flusher = {"mode": flusher.get("mode"), "pid": flusher.get("pid"),
                       "mongo": gate_view(flusher.get("mongo_gate"))}
        return row | {"reachable": True, "mongo": gate_view(health.get("mongo_gate")),
                      "flusher": flusher}

