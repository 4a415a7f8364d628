"""What the tracing hooks on a push's path cost, per push, in this process: `push_span` around
the POST, `answered`, and the trace headers (msgbus/telemetry.py, msgbus/delivery/headers.py).

Off (the default) is what every push pays; on makes a span per push (the SDK with a batch
processor whose exporter drops the spans, so the export's own network cost is not counted).
bench.dispatch prints both beside the dispatcher's CPU per push measured in the same run.

    python -m bench.tracing_cost
"""

from __future__ import annotations

import timeit
from collections.abc import Sequence
from typing import Any

from msgbus import telemetry
from msgbus.delivery.headers import push_headers
from msgbus.models import Envelope, Subscription

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PUSHES = 20_000


def _one_push(envelope: Envelope, subscription: Subscription) -> None:
    with telemetry.push_span(envelope, subscription, 1) as trace:
        push_headers(envelope, subscription, 1, trace.traceparent)
        trace.answered(200, None)


def _per_push_us(envelope: Envelope, subscription: Subscription) -> float:
    best = min(timeit.repeat(lambda: _one_push(envelope, subscription), number=PUSHES, repeat=3))
    return best / PUSHES * 1e6


def _dropping_tracer() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    return provider.get_tracer("bench")


def hook_costs_us() -> dict[str, float]:
    """µs per push: "headers" (push headers alone, the baseline every push pays anyway),
    "off" and "on" (headers plus the tracing hooks), for a message with a trace context."""
    subscription = Subscription(destination="orders", name="bench",
                                url="http://127.0.0.1:9/hook")  # type: ignore[arg-type]
    envelope = Envelope(message_id="0190-id", destination="orders", body=b"{}",
                        biz_id="order-1", traceparent=PARENT)
    headers = min(timeit.repeat(lambda: push_headers(envelope, subscription, 1),
                                number=PUSHES, repeat=3)) / PUSHES * 1e6
    saved = telemetry._tracer
    try:
        telemetry._tracer = None
        off = _per_push_us(envelope, subscription)
        telemetry._tracer = _dropping_tracer()
        on = _per_push_us(envelope, subscription)
    finally:
        telemetry._tracer = saved
    return {"headers": headers, "off": off, "on": on}


if __name__ == "__main__":
    costs = hook_costs_us()
    print(f"per push: headers {costs['headers']:.2f} µs; with the tracing hooks off "
          f"{costs['off']:.2f} µs, on {costs['on']:.2f} µs")
