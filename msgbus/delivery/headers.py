"""Push headers: CloudEvents HTTP binary mode plus Standard Webhooks signature headers, and
the message's W3C trace context (msgbus/tracecontext.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import quote

from msgbus.delivery.signing import sign
from msgbus.models import Envelope, Subscription

CE_SOURCE = "msgbus"


# The CloudEvents HTTP binding percent-encodes a string attribute's space, '"', '%' and every
# character outside printable ASCII (as UTF-8 bytes); every other printable character stays.
_CE_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"%')


def ce_string(value: str) -> str:
    return quote(value, safe=_CE_SAFE)


def plain(secret: str) -> str:
    return secret


def push_headers(envelope: Envelope, subscription: Subscription, attempt: int,
                 hop_traceparent: str | None = None,
                 open_secret: Callable[[str], str] = plain) -> dict[str, str]:
    """`hop_traceparent`: the push span's context when tracing is on (else the producer's);
    `open_secret`: the plain signing secret of a sealed one (msgbus/sealing.py)."""
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
            [open_secret(s) for s in subscription.secrets_signing_at(timestamp)],
            envelope.message_id, timestamp, envelope.body),
    }
    if envelope.biz_id is not None:
        headers["ce-bizid"] = ce_string(envelope.biz_id)
    if envelope.traceparent is not None:
        headers["ce-traceparent"] = envelope.traceparent  # the creation context, unchanged
        headers["traceparent"] = hop_traceparent or envelope.traceparent
        if envelope.tracestate:
            headers["ce-tracestate"] = headers["tracestate"] = envelope.tracestate
    for name, value in envelope.headers.items():
        headers.setdefault(f"x-msgbus-{name.lower()}", value)
    return headers
