"""A destination's page: its broker and the switches that led to it (from the audit log, with who
made each), the brokers still being drained, its subscriptions with their health (the
dashboard's cached figures), its payload schema versions, and its messages per hour."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from admin.dashboard import Dashboard, SubscriptionHealth
from msgbus.models import Destination, PayloadSchema
from msgbus.store.users import UserStore

AUDIT_READ = 500  # the destination's newest audit entries the history is read from


@dataclass(slots=True)
class Switch:
    at: datetime
    by: str
    from_broker: str | None  # None: the destination was created
    to_broker: str


@dataclass(slots=True)
class DestinationView:
    destination: Destination
    switches: list[Switch]  # newest first
    subscriptions: list[SubscriptionHealth]
    schemas: list[PayloadSchema]
    hours: list[datetime]
    volume: list[int]

    @property
    def peak(self) -> int:
        return max(self.volume, default=0)


async def broker_switches(users: UserStore, code: str) -> list[Switch]:
    """Each `destination.put` that set a broker other than the one before, newest first."""
    entries = await users.audit_log(AUDIT_READ, target=code)
    switches: list[Switch] = []
    current: str | None = None
    for entry in reversed(entries):  # oldest first
        if entry.get("action") != "destination.put":
            continue
        broker = (entry.get("details") or {}).get("broker")
        if broker and broker != current:
            switches.append(Switch(entry["at"], str(entry.get("by", "")), current, broker))
            current = broker
    return switches[::-1]


def destination_view(destination: Destination, switches: list[Switch], dashboard: Dashboard,
                     schemas: list[PayloadSchema]) -> DestinationView:
    prefix = f"{destination.code}/"
    return DestinationView(
        destination=destination, switches=switches,
        subscriptions=[h for h in dashboard.subscriptions if h.id.startswith(prefix)],
        schemas=sorted(schemas, key=lambda s: -s.version), hours=dashboard.hours,
        volume=dashboard.volume.get(destination.code, [0] * len(dashboard.hours)))


def schema_summary(schema: PayloadSchema) -> dict[str, Any]:
    """What a version's row shows: its top-level fields and which of them are required."""
    body = schema.schema_ if isinstance(schema.schema_, dict) else {}
    return {"fields": sorted((body.get("properties") or {}).keys()),
            "required": sorted(body.get("required") or [])}
