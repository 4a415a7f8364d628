"""Seeded bus records for the analytics tests and benchmark, in the product's document shapes
(msgbus/store/documents.py), written straight into MongoDB.

Messages go to the destinations in turn. Deterministic: the i-th message of a destination has
fixed times, outcomes and latencies per subscription, so a test can compute what the
statistics must say from the documents themselves.
Subscription profiles by name:
- mailer: every 10th delivery parked after 3 failed pushes (HTTP 500); every 10th + 1 and
  + 2 delivered on the 2nd push (the first got 503); the rest on the 1st.
- shipping: every 50th failed once (waiting for a retry); every 50th + 1 pending (no push yet).
- search: every 4th skipped (its filter did not match: no push).
- any other: delivered on the 1st push.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pymongo import MongoClient

from msgbus.models import AttemptResult, Envelope, subscription_id
from msgbus.store import documents as docs
from msgbus.store.indexes import INDEXES

RETRY_DELAY = timedelta(seconds=10)
ACCEPT_DELAY = timedelta(milliseconds=2)  # created (client) -> received (receiver)
PUSH_DELAY = timedelta(milliseconds=1)  # received -> first push starts


@dataclass(frozen=True)
class SeedPlan:
    start: datetime
    span: timedelta
    messages: int
    destinations: dict[str, list[str]] = field(default_factory=lambda: {
        "orders": ["billing", "shipping"], "users": ["mailer"]})
    body_bytes: int = 64


@dataclass
class Records:
    messages: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.messages) + len(self.deliveries) + len(self.attempts)


def latency_ms(name: str, i: int, ok: bool) -> float:
    if not ok:
        return 1000.0 + i % 100
    base, spread = {"billing": (5, 20), "shipping": (20, 80), "mailer": (200, 600)}.get(
        name, (10, 40))
    return float(base + i % spread)


def outcome(name: str, i: int) -> tuple[str, list[int]]:
    """(final status, the status code of each push in order)."""
    if name == "mailer":
        if i % 10 == 0:
            return "parked", [500, 500, 500]
        if i % 10 in (1, 2):
            return "delivered", [503, 200]
    if name == "shipping":
        if i % 50 == 0:
            return "failed", [500]
        if i % 50 == 1:
            return "pending", []
    if name == "search" and i % 4 == 0:
        return "skipped", []
    return "delivered", [200]


def message_id(i: int) -> str:
    return f"m{i:09d}"


def generate(plan: SeedPlan, first: int = 0, count: int | None = None) -> Records:
    """Messages first..first+count of the plan with their deliveries and attempts."""
    records = Records()
    codes = sorted(plan.destinations)
    body = b"x" * plan.body_bytes
    end = plan.messages if count is None else min(plan.messages, first + count)
    for i in range(first, end):
        destination = codes[i % len(codes)]
        created = plan.start + plan.span * i / plan.messages
        envelope = Envelope(message_id=message_id(i), destination=destination, body=body,
                            biz_id=f"order-{i // 3}", source_app="seed", created_at=created,
                            received_at=created + ACCEPT_DELAY)
        subs = [subscription_id(destination, name) for name in plan.destinations[destination]]
        records.messages.append(docs.message_doc(envelope, subs))
        for name, sub in zip(plan.destinations[destination], subs, strict=True):
            _delivery(records, envelope, name, sub, i // len(codes))
    return records


def _delivery(records: Records, envelope: Envelope, name: str, sub: str, i: int) -> None:
    """`i`: the message's number among its destination's messages."""
    assert envelope.received_at is not None
    status, codes = outcome(name, i)
    delivery = docs.delivery_doc(envelope, sub, envelope.received_at)
    started = envelope.received_at + PUSH_DELAY
    for attempt, code in enumerate(codes, start=1):
        ok = code == 200
        latency = latency_ms(name, i, ok)
        records.attempts.append(docs.attempt_doc(AttemptResult(
            message_id=envelope.message_id, subscription=sub, attempt=attempt,
            started_at=started, latency_ms=latency, status_code=code, instance="seed")))
        finished = started + timedelta(milliseconds=latency)
        delivery.update(last_status_code=code, last_latency_ms=latency, last_attempt_at=started,
                        updated_at=finished, last_error=None if ok else f"HTTP {code}")
        if ok:
            delivery["delivered_at"] = finished
        started = finished + RETRY_DELAY
    delivery.update(status=status, attempts=len(codes),
                    next_attempt_at=started if status == "failed" else None)
    records.deliveries.append(delivery)


def chunks(plan: SeedPlan, size: int) -> Iterator[Records]:
    for first in range(0, plan.messages, size):
        yield generate(plan, first, size)


def ensure_indexes(uri: str, database: str) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        for collection, indexes in INDEXES.items():
            client[database][collection].create_indexes(indexes)
    finally:
        client.close()


def insert(uri: str, database: str, records: Records) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        db = client[database]
        for name in ("messages", "deliveries", "attempts"):
            documents = getattr(records, name)
            if documents:
                db[name].insert_many(documents, ordered=False)
    finally:
        client.close()
