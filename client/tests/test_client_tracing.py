"""send()'s trace context: the caller's current OpenTelemetry span, or one stated, checked as
the receiver checks it, so that a bad one fails in send() and not in the spool."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider

from msgbus_client.errors import InvalidMessageError
from msgbus_client.message import build_entry

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _fields(**options: str) -> dict[str, str]:
    payload = json.loads(build_entry("orders", {"n": 1}, **options).payload)  # type: ignore[arg-type]
    return {k: v for k, v in payload.items() if k in ("traceparent", "tracestate")}


def test_the_current_span_is_the_messages_trace_context() -> None:
    with TracerProvider().get_tracer("app").start_as_current_span("checkout") as span:
        context = span.get_span_context()
        fields = _fields()
    assert fields == {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                                     f"{context.trace_flags:02x}"}
    assert _fields() == {}  # no current span, no trace context


def test_a_stated_trace_context_wins_and_is_checked() -> None:
    with TracerProvider().get_tracer("app").start_as_current_span("checkout"):
        assert _fields(traceparent=PARENT, tracestate="a=1") == {
            "traceparent": PARENT, "tracestate": "a=1"}
    for bad in ({"traceparent": PARENT.upper()}, {"tracestate": "a=1"},
                {"traceparent": PARENT, "tracestate": "é"}):
        with pytest.raises(InvalidMessageError):
            _fields(**bad)
