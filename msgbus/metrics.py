"""Prometheus metrics of every service. Names follow `msgbus_<what>_<unit>`."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

MESSAGES_ACCEPTED = Counter(
    "msgbus_messages_accepted_total", "Messages accepted by the receiver", ["destination"])
MESSAGES_DUPLICATE = Counter(
    "msgbus_messages_duplicate_total",
    "Messages the receiver had already accepted (client re-sends), answered 'duplicate'",
    ["destination"])
MESSAGES_REJECTED = Counter(
    "msgbus_messages_rejected_total", "Messages the receiver refused, by reason", ["reason"])
PUBLISHED = Counter(
    "msgbus_published_total", "Publish outcomes by broker", ["broker", "outcome"])
BUFFER_DEPTH = Gauge(
    "msgbus_local_buffer_entries", "Entries waiting in a local LMDB buffer", ["service", "queue"])
PUSHES = Counter(
    "msgbus_pushes_total", "Pushes to subscribers by outcome", ["subscription", "outcome"])
PUSH_LATENCY = Histogram(
    "msgbus_push_latency_seconds", "Subscriber response time", ["subscription"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
IN_FLIGHT = Gauge(
    "msgbus_pushes_in_flight", "Pushes in flight (semaphore occupancy)", ["subscription"])


def render() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST
