"""Push headers: CloudEvents HTTP binary mode plus Standard Webhooks signature headers."""

from __future__ import annotations

import time

from msgbus.delivery.signing import sign
from msgbus.models import Envelope, Subscription

CE_SOURCE = "msgbus"


def push_headers(envelope: Envelope, subscription: Subscription, attempt: int) -> dict[str, str]:
    timestamp = int(time.time())
    headers = {
        "content-type": envelope.content_type,
        "ce-specversion": "1.0",
        "ce-id": envelope.message_id,
        "ce-source": f"{CE_SOURCE}/{envelope.source_app or 'unknown'}",
        "ce-type": envelope.destination,
        "ce-time": envelope.created_at.isoformat().replace("+00:00", "Z"),
        "ce-subscription": subscription.name,
        "ce-attempt": str(attempt),
        "webhook-id": envelope.message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(
            subscription.signing_secrets, envelope.message_id, timestamp, envelope.body),
    }
    if envelope.biz_id is not None:
        headers["ce-bizid"] = envelope.biz_id
    for name, value in envelope.headers.items():
        headers.setdefault(f"x-msgbus-{name.lower()}", value)
    return headers
