"""The W3C trace context a message carries: the caller's, so that each subscriber's trace joins
the producer's (the bus pushes it as `traceparent` and `ce-traceparent`).

`send(..., traceparent=...)` states it; otherwise, when OpenTelemetry's API is installed (the
`otel` extra) and a span is current, that span's context is taken. The format is checked here
as the receiver checks it, so that a bad value fails in send(), not in the spool.
"""

from __future__ import annotations

import re

from msgbus_client.errors import InvalidMessageError

_TRACEPARENT_RE = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE_RE = re.compile(r"[\x20-\x7e]{0,512}")

try:
    from opentelemetry import trace as _otel_trace
except ImportError:  # the otel extra is not installed: only a stated trace context is sent
    _otel_trace = None  # type: ignore[assignment]


def current_trace_context() -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of the caller's current OpenTelemetry span, if any."""
    if _otel_trace is None:
        return None, None
    context = _otel_trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, None
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    state = context.trace_state.to_header() if context.trace_state else None
    return parent, state or None


def checked_trace_context(traceparent: object,
                          tracestate: object) -> tuple[str | None, str | None]:
    """The stated trace context, or the current span's when none is stated."""
    if traceparent is None:
        if tracestate is not None:
            raise InvalidMessageError("tracestate goes with a traceparent")
        return current_trace_context()
    if not isinstance(traceparent, str) or not _TRACEPARENT_RE.fullmatch(traceparent):
        raise InvalidMessageError(
            "traceparent must be a W3C traceparent, e.g. "
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    if tracestate is not None and (not isinstance(tracestate, str)
                                   or not _TRACESTATE_RE.fullmatch(tracestate)):
        raise InvalidMessageError("tracestate must be W3C tracestate text "
                                  "(at most 512 printable ASCII characters)")
    return traceparent, tracestate
