"""Batch pushes: several messages of one subscription in one POST, as a CloudEvents batch
(`application/cloudevents-batch+json`, the CloudEvents JSON event format): a JSON array of
structured events, signed once with Standard Webhooks (one `webhook-id`, the batch's id; the
signature over the whole body).

Each event carries what a single push carries in `ce-` headers: `id` (the message id),
`source`, `type` (the destination), `time`, `datacontenttype`, the extensions `subscription`,
`attempt`, `bizid`, `traceparent`/`tracestate`, and the message's own headers as one JSON text
in `msgbusheaders` (CloudEvents attribute names allow only a-z and 0-9). A JSON body is the
event's `data`, byte for byte; any other body is `data_base64`.

The events are encoded one by one, so a batch is cut at `batch_max_bytes` exactly.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from msgbus.delivery.headers import CE_SOURCE, plain
from msgbus.delivery.signing import sign
from msgbus.ids import uuid7
from msgbus.models import Envelope, Subscription

BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
HEADERS_EXTENSION = "msgbusheaders"
# what an event adds to its body, for the estimate that decides when a batch is full
EVENT_OVERHEAD_BYTES = 320


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _data(envelope: Envelope) -> tuple[str, Any]:
    """('data', the JSON body as it is) or ('data_base64', its base64)."""
    if is_json(envelope.content_type):
        try:
            orjson.loads(envelope.body)
            return "data", orjson.Fragment(envelope.body)
        except orjson.JSONDecodeError:
            pass  # labelled JSON, but not: carried as bytes, never altered
    return "data_base64", base64.b64encode(envelope.body).decode()


def event_of(envelope: Envelope, subscription: Subscription, attempt: int) -> dict[str, Any]:
    """One message as a structured CloudEvent (JSON event format)."""
    event: dict[str, Any] = {
        "specversion": "1.0",
        "id": envelope.message_id,
        "source": f"{CE_SOURCE}/{envelope.source_app or 'unknown'}",
        "type": envelope.destination,
        "time": envelope.created_at.isoformat().replace("+00:00", "Z"),
        "datacontenttype": envelope.content_type,
        "subscription": subscription.name,
        "attempt": attempt,
    }
    if envelope.biz_id is not None:
        event["bizid"] = envelope.biz_id
    if envelope.traceparent is not None:
        event["traceparent"] = envelope.traceparent
        if envelope.tracestate:
            event["tracestate"] = envelope.tracestate
    if envelope.headers:
        event[HEADERS_EXTENSION] = orjson.dumps(envelope.headers).decode()
    name, value = _data(envelope)
    event[name] = value
    return event


def encode_event(envelope: Envelope, subscription: Subscription, attempt: int) -> bytes:
    return orjson.dumps(event_of(envelope, subscription, attempt))


def estimated_size(envelope: Envelope) -> int:
    """About what the message adds to a batch's body, without encoding it."""
    body = len(envelope.body)
    if not is_json(envelope.content_type):
        body = (body + 2) // 3 * 4
    headers = sum(len(k) + len(v) + 6 for k, v in envelope.headers.items())
    return body + headers + EVENT_OVERHEAD_BYTES


@dataclass(slots=True)
class BatchPush:
    """One batch push: its messages (in order), each one's attempt number, and its body."""

    batch_id: str
    envelopes: list[Envelope] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    events: list[bytes] = field(default_factory=list)
    size: int = 2  # the body's length: '[' and ']' plus the events and their commas

    @property
    def body(self) -> bytes:
        return b"[" + b",".join(self.events) + b"]"

    def __len__(self) -> int:
        return len(self.envelopes)


class BatchBuilder:
    """Gathers messages into one batch within the subscription's limits."""

    def __init__(self, subscription: Subscription) -> None:
        self._sub = subscription
        self._max_messages = subscription.batch_max_messages or 1
        self.batch = BatchPush(batch_id=uuid7())

    @property
    def full(self) -> bool:
        return (len(self.batch) >= self._max_messages
                or self.batch.size >= self._sub.batch_max_bytes)

    def add(self, envelope: Envelope, attempt: int, *, force: bool = False) -> bool:
        """Adds the message unless it would break a limit; a first message always fits
        (one larger than batch_max_bytes goes alone). `force`: whatever the limits (a batch
        sent again, whose attempt numbers may have grown by a digit)."""
        if len(self.batch) >= self._max_messages and not force:
            return False
        event = encode_event(envelope, self._sub, attempt)
        size = self.batch.size + len(event) + (1 if self.batch.events else 0)
        if self.batch.events and size > self._sub.batch_max_bytes and not force:
            return False
        self.batch.envelopes.append(envelope)
        self.batch.attempts.append(attempt)
        self.batch.events.append(event)
        self.batch.size = size
        return True


def batches_of(items: Iterable[tuple[Envelope, int]],
               subscription: Subscription) -> list[BatchPush]:
    """(message, attempt) pairs cut into batches in order, each within the limits."""
    batches: list[BatchPush] = []
    builder = BatchBuilder(subscription)
    for envelope, attempt in items:
        if not builder.add(envelope, attempt):
            batches.append(builder.batch)
            builder = BatchBuilder(subscription)
            builder.add(envelope, attempt)
    if len(builder.batch):
        batches.append(builder.batch)
    return batches


def batch_headers(batch: BatchPush, subscription: Subscription, body: bytes,
                  open_secret: Callable[[str], str] = plain) -> dict[str, str]:
    """No `ce-` headers (the CloudEvents batch mode): each event carries its attributes."""
    timestamp = int(time.time())
    return {
        "content-type": BATCH_CONTENT_TYPE,
        "webhook-id": batch.batch_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(
            [open_secret(s) for s in subscription.secrets_signing_at(timestamp)],
            batch.batch_id, timestamp, body),
        "x-msgbus-batch-size": str(len(batch)),
    }
