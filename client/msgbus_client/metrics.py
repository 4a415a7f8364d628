"""What a client has done, for an application to expose: counters kept by the client, spool
gauges read when asked, and an optional Prometheus collector.

    from msgbus_client.metrics import register_prometheus
    register_prometheus(bus)  # into prometheus_client's default registry

`prometheus_client` is imported only by `register_prometheus`/`PrometheusCollector`; install it
with the `prometheus` extra. Every metric carries a `spool` label (the spool dir) so that an
application with several clients keeps their series apart.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from msgbus_client.spool import Spool


class ClientCounters:
    """Thread-safe counters, updated by send(), the delivery paths and the resender."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._send_errors: Counter[str] = Counter()

    def add(self, name: str, amount: int = 1) -> None:
        if amount:
            with self._lock:
                self._counts[name] += amount

    def send_error(self, exc: BaseException) -> None:
        with self._lock:
            self._send_errors[type(exc).__name__] += 1

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            return dict(self._counts), dict(self._send_errors)


# counter names used by the client (ClientCounters.add)
SENT = "sent"  # send() returned: the message is durable in the spool
ACKED = "acked"  # messages the receiver acknowledged (and the spool dropped)
REJECTED = "rejected"  # messages the receiver refused as invalid (moved to `rejected`)
INLINE_REQUESTS = "inline_requests"  # POSTs made by send() itself
RESEND_REQUESTS = "resend_requests"  # POSTs made by the resender (resend attempts)
RESENT_MESSAGES = "resent_messages"  # messages in those POSTs
FAILED_REQUESTS = "failed_requests"  # POSTs that failed (timeout, refused, 5xx, 429, ...)


@dataclass(frozen=True, slots=True)
class ClientMetrics:
    """A snapshot of one client."""

    spool_dir: str
    pending: int
    rejected: int
    used_bytes: int
    max_bytes: int
    oldest_age_s: float | None  # age of the oldest pending message; None when none waits
    backing_off: bool  # the receiver is failing and the client waits before trying again
    counters: dict[str, int] = field(default_factory=dict)
    send_errors: dict[str, int] = field(default_factory=dict)  # exception name -> count


class _MeasuredClient(Protocol):
    def metrics(self) -> ClientMetrics: ...


def snapshot(
    spool: Spool, counters: ClientCounters, *, backing_off: bool
) -> ClientMetrics:
    stats = spool.stats()
    oldest_ms = spool.oldest_message_ms()
    counts, errors = counters.snapshot()
    return ClientMetrics(
        spool_dir=str(spool.path),
        pending=stats.pending,
        rejected=stats.rejected,
        used_bytes=stats.used_bytes,
        max_bytes=stats.max_bytes,
        oldest_age_s=None if oldest_ms is None else max(0.0, time.time() - oldest_ms / 1000),
        backing_off=backing_off,
        counters=counts,
        send_errors=errors,
    )


class PrometheusCollector:
    """A prometheus_client collector reading `client.metrics()` at each scrape."""

    def __init__(self, client: _MeasuredClient) -> None:
        self._client = client

    def describe(self) -> list[Any]:
        return []  # unchecked collector: the series depend on the client's state

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from msgbus_client.errors import SpoolError

        try:
            m = self._client.metrics()
        except SpoolError:  # the client is closed: it has nothing left to report
            return
        labels = ["spool"]
        spool = [m.spool_dir]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(spool, value)
            return family

        def counter(name: str, doc: str, key: str) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(spool, m.counters.get(key, 0))
            return family

        yield gauge("msgbus_client_spool_pending_messages", "Messages waiting in the spool.",
                    m.pending)
        yield gauge("msgbus_client_spool_rejected_messages",
                    "Messages the receiver refused, kept in the spool's rejected area.",
                    m.rejected)
        yield gauge("msgbus_client_spool_used_bytes", "Bytes used in the spool.", m.used_bytes)
        yield gauge("msgbus_client_spool_max_bytes", "The spool's size limit.", m.max_bytes)
        yield gauge("msgbus_client_spool_oldest_message_age_seconds",
                    "Age of the oldest message waiting in the spool (0 when none).",
                    m.oldest_age_s or 0.0)
        yield gauge("msgbus_client_receiver_backing_off",
                    "1 while the receiver is failing and the client waits to retry.",
                    1.0 if m.backing_off else 0.0)
        yield counter("msgbus_client_messages_sent", "send() calls that spooled a message.", SENT)
        yield counter("msgbus_client_messages_acked",
                      "Messages the receiver acknowledged.", ACKED)
        yield counter("msgbus_client_messages_rejected",
                      "Messages the receiver refused as invalid.", REJECTED)
        yield counter("msgbus_client_resend_attempts",
                      "Requests the background resender made.", RESEND_REQUESTS)
        yield counter("msgbus_client_resent_messages",
                      "Messages in the resender's requests.", RESENT_MESSAGES)
        yield counter("msgbus_client_inline_requests",
                      "Requests send() made itself.", INLINE_REQUESTS)
        yield counter("msgbus_client_failed_requests",
                      "Requests to the receiver that failed and will be retried.",
                      FAILED_REQUESTS)
        errors = CounterMetricFamily("msgbus_client_send_errors",
                                     "send() calls that raised, by exception.",
                                     labels=[*labels, "error"])
        for name, count in sorted(m.send_errors.items()):
            errors.add_metric([*spool, name], count)
        yield errors


def register_prometheus(client: _MeasuredClient, registry: Any = None) -> PrometheusCollector:
    """Register a collector for `client` (default: prometheus_client's global REGISTRY).
    Unregister it (`registry.unregister(collector)`) when the client is closed."""
    try:
        from prometheus_client import REGISTRY
    except ImportError as exc:
        raise ImportError(
            "register_prometheus needs prometheus_client: pip install 'msgbus-client[prometheus]'"
        ) from exc
    collector = PrometheusCollector(client)
    (registry or REGISTRY).register(collector)
    return collector
