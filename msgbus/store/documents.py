"""Conversions between domain objects and MongoDB documents."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson
from bson import Binary

from msgbus.errors import InvalidConfig
from msgbus.models import (
    AttemptResult,
    DeliveryStatus,
    Destination,
    Envelope,
    PayloadSchema,
    ProducerApp,
    ReplayJob,
    RuntimeConfig,
    Subscription,
    delivery_id,
)
from msgbus.users import TokenRecord, UserRecord

RUNTIME_ID = "bus"  # the one document of the runtime collection


def message_doc(envelope: Envelope, subscriptions: list[str]) -> dict[str, Any]:
    return {
        "_id": envelope.message_id,
        "destination": envelope.destination,
        "biz_id": envelope.biz_id,
        "source_app": envelope.source_app,
        "created_at": envelope.created_at,
        "received_at": envelope.received_at,
        "content_type": envelope.content_type,
        "headers": envelope.headers,
        "body": Binary(envelope.body),
        "size": len(envelope.body),
        "subscriptions": subscriptions,
        **_trace_context(envelope),
        "schema_version": envelope.schema_version,
        **({} if envelope.deliver_at is None else {"deliver_at": envelope.deliver_at}),
    }


def _trace_context(envelope: Envelope) -> dict[str, str]:
    fields = {"traceparent": envelope.traceparent, "tracestate": envelope.tracestate}
    return {name: value for name, value in fields.items() if value is not None}


def envelope_from_doc(doc: dict[str, Any]) -> Envelope:
    return Envelope(
        message_id=doc["_id"],
        destination=doc["destination"],
        body=bytes(doc["body"]),
        content_type=doc["content_type"],
        biz_id=doc.get("biz_id"),
        source_app=doc.get("source_app"),
        created_at=doc["created_at"],
        received_at=doc.get("received_at"),
        headers=doc.get("headers") or {},
        traceparent=doc.get("traceparent"),
        tracestate=doc.get("tracestate"),
        schema_version=doc.get("schema_version"),
        deliver_at=doc.get("deliver_at"),
    )


def delivery_doc(envelope: Envelope, sub_id: str, now: datetime,
                 status: DeliveryStatus = DeliveryStatus.PENDING) -> dict[str, Any]:
    """A delivery's state before any outcome: pending (versions before the pending batches
    wrote one per delivery at record time; tests and benchmarks seed them), or failed and due
    (a sweep's)."""
    return message_delivery_doc(
        {"_id": envelope.message_id, "destination": envelope.destination,
         "biz_id": envelope.biz_id, "created_at": envelope.created_at}, sub_id, now, status)


def message_delivery_doc(message: dict[str, Any], sub_id: str, now: datetime,
                         status: DeliveryStatus) -> dict[str, Any]:
    """The same from a message document (at least its _id, destination, biz_id, created_at)."""
    return {
        "_id": delivery_id(message["_id"], sub_id),
        "message_id": message["_id"],
        "subscription": sub_id,
        "destination": message["destination"],
        "biz_id": message.get("biz_id"),
        "status": status.value,
        "attempts": 0,
        "created_at": message["created_at"],
        "updated_at": now,
    }


def pending_batch_doc(batch_id: str, sub_id: str, envelopes: list[Envelope],
                      now: datetime) -> dict[str, Any]:
    """The messages of one record batch that `sub_id` is to get: the compensator's sweep looks
    up which of them never got an outcome."""
    return {
        "_id": batch_id,
        "subscription": sub_id,
        "recorded_at": now,
        "message_ids": [e.message_id for e in envelopes],
        "n": len(envelopes),
        "oldest_created_at": min(e.created_at for e in envelopes),
    }


def attempt_doc(result: AttemptResult) -> dict[str, Any]:
    # A deterministic _id makes re-writing a batch after a crash idempotent.
    started_us = int(result.started_at.timestamp() * 1_000_000)
    doc = {
        "_id": f"{result.message_id}|{result.subscription}|{started_us}|{result.instance}",
        "message_id": result.message_id,
        "subscription": result.subscription,
        "attempt": result.attempt,
        "started_at": result.started_at,
        "latency_ms": result.latency_ms,
        "status_code": result.status_code,
        "error": result.error,
        "instance": result.instance,
        "ok": result.ok,
    }
    if result.batch_id is not None:
        doc["batch_id"] = result.batch_id
    if result.answer is not None:
        doc["answer"] = result.answer
    return doc


def destination_doc(destination: Destination) -> dict[str, Any]:
    doc = destination.model_dump(mode="python")
    doc["_id"] = doc.pop("code")
    return doc


def destination_from_doc(doc: dict[str, Any]) -> Destination:
    return Destination.model_validate({**doc, "code": doc["_id"]})


def subscription_doc(subscription: Subscription) -> dict[str, Any]:
    doc = subscription.model_dump(mode="json")
    doc["created_at"] = subscription.created_at
    doc["updated_at"] = subscription.updated_at
    doc["_id"] = subscription.id
    return doc


def subscription_from_doc(doc: dict[str, Any]) -> Subscription:
    doc = {k: v for k, v in doc.items() if k != "_id"}
    return Subscription.model_validate(doc)


def runtime_doc(config: RuntimeConfig) -> dict[str, Any]:
    return config.model_dump(mode="json") | {"_id": RUNTIME_ID, "updated_at": config.updated_at}


def runtime_from_doc(doc: dict[str, Any]) -> RuntimeConfig:
    return RuntimeConfig.model_validate({k: v for k, v in doc.items() if k != "_id"})


# Each collection of configuration, and how its readers parse a document: what a write must
# read back as, and what the admin's GET /v1/invalid-documents checks.
def schema_doc(schema: PayloadSchema) -> dict[str, Any]:
    """A payload schema version; the schema as JSON text, since its keys (`$ref`, `$defs`,
    names with dots) are not all field names MongoDB takes as they are."""
    try:
        text = orjson.dumps(schema.schema_).decode()
    except TypeError as exc:  # an integer beyond 64 bits, a lone surrogate
        raise InvalidConfig(f"the schema cannot be stored: {exc}", field="schema") from exc
    return {"_id": schema.id, "destination": schema.destination, "version": schema.version,
            "schema_json": text,
            "compatibility": schema.compatibility.value, "created_at": schema.created_at,
            "created_by": schema.created_by}


def schema_from_doc(doc: dict[str, Any]) -> PayloadSchema:
    fields = {k: v for k, v in doc.items() if k not in ("_id", "schema_json")}
    return PayloadSchema.model_validate(fields | {"schema": orjson.loads(doc["schema_json"])})


CONFIG_PARSERS: dict[str, Callable[[dict[str, Any]], object]] = {
    "destinations": destination_from_doc,
    "subscriptions": subscription_from_doc,
    "runtime": runtime_from_doc,
    "apps": ProducerApp.model_validate,
    "users": UserRecord.model_validate,
    "api_tokens": TokenRecord.model_validate,
    "replays": ReplayJob.model_validate,
    "schemas": schema_from_doc,
}
