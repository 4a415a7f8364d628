"""A batch of outcomes as writes of delivery states: the outcomes of one delivery folded into
one write, a delivered state never turned back (`RecordStore.record_outcomes`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo import UpdateOne

from msgbus.models import DeliveryOutcome, DeliveryStatus, delivery_id, utcnow


def group_by_delivery(outcomes: Sequence[DeliveryOutcome]) -> dict[str, list[DeliveryOutcome]]:
    groups: dict[str, list[DeliveryOutcome]] = {}
    for outcome in outcomes:
        key = delivery_id(outcome.result.message_id, outcome.result.subscription)
        groups.setdefault(key, []).append(outcome)
    return groups


def _state_fields(group: list[DeliveryOutcome]) -> tuple[dict[str, Any], bool]:
    """The fields the group's outcomes set, and whether one of them delivered."""
    delivered = next((o for o in group if o.result.ok), None)
    final = delivered or group[-1]
    result = final.result
    now = utcnow()
    fields: dict[str, Any] = {"updated_at": now}
    if final.pushed or final.skipped:
        fields.update(last_status_code=result.status_code, last_error=result.error,
                      last_latency_ms=result.latency_ms, last_attempt_at=result.started_at)
    if delivered is not None:
        fields.update(status=DeliveryStatus.DELIVERED.value, delivered_at=now, next_attempt_at=None)
    else:
        fields.update(status=_failed_status(final).value, next_attempt_at=final.next_attempt_at)
    scheduled = next((o.scheduled_for for o in group if o.scheduled_for is not None), None)
    if scheduled is not None:
        fields["scheduled_for"] = scheduled
    return fields, delivered is not None


def _identity(group: list[DeliveryOutcome]) -> dict[str, Any]:
    """What a delivery's state says of the message, whichever write creates it."""
    final = group[-1]
    return {
        "message_id": final.result.message_id,
        "subscription": final.result.subscription,
        "destination": final.destination,
        "biz_id": final.biz_id,
        "created_at": final.created_at,
    }


def _attempts(group: list[DeliveryOutcome]) -> int:
    return sum(1 for o in group if o.pushed)


def only_scheduled(group: list[DeliveryOutcome]) -> bool:
    return all(o.scheduled_for is not None for o in group)


def new_state(group: list[DeliveryOutcome]) -> dict[str, Any]:
    fields, _ = _state_fields(group)
    identity = _identity(group)
    return {"_id": delivery_id(identity["message_id"], identity["subscription"]),
            **identity, **fields, "attempts": _attempts(group)}


def state_update(group: list[DeliveryOutcome]) -> UpdateOne:
    fields, delivered = _state_fields(group)
    identity = _identity(group)
    query: dict[str, Any] = {"_id": delivery_id(identity["message_id"], identity["subscription"])}
    if not delivered:
        query["status"] = {"$ne": DeliveryStatus.DELIVERED.value}
    return UpdateOne(query, {"$set": fields, "$inc": {"attempts": _attempts(group)},
                             "$setOnInsert": identity}, upsert=True)


def _failed_status(outcome: DeliveryOutcome) -> DeliveryStatus:
    if outcome.scheduled_for is not None:
        return DeliveryStatus.SCHEDULED
    if outcome.skipped:
        return DeliveryStatus.SKIPPED
    if outcome.parked:
        return DeliveryStatus.PARKED
    if outcome.retrying_in_place:
        return DeliveryStatus.RETRYING
    return DeliveryStatus.FAILED
