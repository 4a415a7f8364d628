"""Subscription filters: whether a message is for a subscriber at all (see `MessageFilter`), and
whether an operator skipped the subscription's backlog past it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from msgbus.models import JSON_CONTENT_TYPE, Envelope, MessageFilter, Subscription

_MISSING = object()


FILTERED_OUT = "filtered out by the subscription"


def subscription_receives(subscription: Subscription, envelope: Envelope) -> bool:
    """A subscription gets the messages accepted after it was created, not the history (the
    receiver records a message's deliveries by this rule; the dispatcher pushes by it)."""
    return envelope.accepted_at >= subscription.created_at


def why_not_pushed(subscription: Subscription, envelope: Envelope) -> str | None:
    """Why the message is recorded as skipped instead of pushed; None: it is pushed."""
    if subscription.skip_before is not None:
        received = _aware(envelope.accepted_at)
        if received < _aware(subscription.skip_before):
            return f"skipped by an operator: {subscription.skip_reason}"
    return None if matches(subscription, envelope) else FILTERED_OUT


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def matches(subscription: Subscription, envelope: Envelope) -> bool:
    """True when every filter of the subscription matches (no filters: every message)."""
    if not subscription.filters:
        return True
    body: Any = _MISSING
    for rule in subscription.filters:
        if rule.field.startswith("body:"):
            if body is _MISSING:
                body = _json_body(envelope)
            value = _lookup(body, rule.field.removeprefix("body:"))
        else:
            value = _attribute(envelope, rule)
        if value is _MISSING or _as_text(value) not in rule.values:
            return False
    return True


def _attribute(envelope: Envelope, rule: MessageFilter) -> object:
    if rule.field == "biz_id":
        return _MISSING if envelope.biz_id is None else envelope.biz_id
    name = rule.field.removeprefix("header:").lower()
    for key, value in envelope.headers.items():
        if key.lower() == name:
            return value
    return _MISSING


def _json_body(envelope: Envelope) -> object:
    if not envelope.content_type.lower().startswith(JSON_CONTENT_TYPE):
        return _MISSING
    try:
        return orjson.loads(envelope.body)
    except orjson.JSONDecodeError:
        return _MISSING


def _lookup(document: object, path: str) -> object:
    current = document
    for part in path.split("."):
        if isinstance(current, dict):
            current = current.get(part, _MISSING)
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _as_text(value: object) -> str | None:
    """JSON scalars as the text an operator would type: true, 12, 1.5, abc."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None  # objects, lists and null match nothing
