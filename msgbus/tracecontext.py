"""W3C Trace Context (https://www.w3.org/TR/trace-context/) as the bus carries it.

A message keeps the `traceparent` and `tracestate` of the producer's span that sent it (its
creation context). Every push hands them on twice: unchanged as the CloudEvents distributed
tracing extension (`ce-traceparent`, `ce-tracestate`), and as the HTTP `traceparent` and
`tracestate` of the push, whose parent is the producer's span, or the dispatcher's push span
when tracing is on (`msgbus/telemetry.py`). So a subscriber's trace joins the producer's.

A value the producer states (a message's field) and cannot be used is a 422; one that only
travels on the request (its HTTP headers) is ignored when invalid, as the specification asks
of a receiver.
"""

from __future__ import annotations

import re

# version (not ff), trace id and parent id (neither all zeros), flags; lower-case hex
TRACEPARENT_PATTERN = (r"^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}"
                       r"-[0-9a-f]{2}$")
TRACESTATE_PATTERN = r"^[\x20-\x7e]*$"  # printable ASCII, as every list member is
MAX_TRACESTATE_CHARS = 512  # the specification's 32 list members stay within it in practice
TraceContext = tuple[str | None, str | None]  # (traceparent, tracestate)
NO_TRACE: TraceContext = (None, None)
_TRACEPARENT_RE = re.compile(TRACEPARENT_PATTERN)
_TRACESTATE_RE = re.compile(TRACESTATE_PATTERN)


class InvalidTraceContext(ValueError):
    """Why a traceparent or tracestate cannot be used."""


def checked_traceparent(value: object) -> str:
    if not isinstance(value, str) or not _TRACEPARENT_RE.fullmatch(value):
        raise InvalidTraceContext(
            "traceparent must be a W3C traceparent: version-traceid-parentid-flags in lower-case "
            "hex (not version ff, no all-zero id), e.g. "
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    return value


def checked_tracestate(value: object) -> str:
    if (not isinstance(value, str) or len(value) > MAX_TRACESTATE_CHARS
            or not _TRACESTATE_RE.fullmatch(value)):
        raise InvalidTraceContext(
            f"tracestate must be W3C tracestate text: at most {MAX_TRACESTATE_CHARS} printable "
            "ASCII characters, list members key=value separated by commas")
    return value


def trace_id_of(traceparent: str) -> str:
    return traceparent[3:35]


def from_request(traceparent: str | None, tracestate: str | None) -> TraceContext:
    """The trace context of a request's `traceparent` and `tracestate` headers: (None, None)
    when it has none or an invalid traceparent; its tracestate only with a valid one."""
    if traceparent is None:
        return NO_TRACE
    try:
        parent = checked_traceparent(traceparent.strip())
    except InvalidTraceContext:
        return NO_TRACE
    try:
        return parent, (checked_tracestate(tracestate.strip()) if tracestate else None)
    except InvalidTraceContext:
        return parent, None
