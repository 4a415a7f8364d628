"""Optional OpenTelemetry spans: accept and publish (receiver), push and retry (dispatcher,
compensator, replays).

Off by default (`MSGBUS_TRACING_ENABLED`): every function here then tests one module global and
returns, and no OpenTelemetry code runs on a message's path. On, spans go through
opentelemetry-api's tracer with each message's trace context (msgbus/tracecontext.py) as the
parent, and `configure` installs the SDK (the `otel` extra: `pip install msgbus[otel]`) with an
OTLP/HTTP exporter, configured by the standard OTEL_EXPORTER_OTLP_* variables, or the console.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from msgbus.models import Envelope, Subscription
from msgbus.settings import TracingSettings

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span, Tracer

log = logging.getLogger(__name__)

_tracer: Tracer | None = None
MAX_LINKS = 128  # a batch's span links to at most this many messages' producers


def configure(settings: TracingSettings, service: str) -> None:
    """Turn tracing on for this process when the settings ask for it (once per process)."""
    global _tracer
    if not settings.enabled or _tracer is not None:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError as exc:
        raise RuntimeError("MSGBUS_TRACING_ENABLED needs the OpenTelemetry SDK: "
                           "pip install 'msgbus[otel]'") from exc
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    if settings.exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("msgbus")
    log.info("tracing on: spans of %s go to the %s exporter", service, settings.exporter)


def enabled() -> bool:
    return _tracer is not None


def _context_of(envelope: Envelope) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    carrier = {"traceparent": envelope.traceparent or "", "tracestate": envelope.tracestate or ""}
    return TraceContextTextMapPropagator().extract(carrier)


def _links(envelopes: Sequence[Envelope]) -> list[Link]:
    from opentelemetry.trace import Link, get_current_span
    links = []
    for envelope in envelopes[:MAX_LINKS]:
        if envelope.traceparent is not None:
            links.append(Link(get_current_span(_context_of(envelope)).get_span_context()))
    return links


def _hop_traceparent(span: Span) -> str | None:
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return carrier.get("traceparent")


class PushTrace:
    """What a push needs of its span: the traceparent to carry (None when tracing is off: the
    push then carries the producer's) and where to note the subscriber's answer."""

    def __init__(self, span: Span | None = None) -> None:
        self._span = span
        self.traceparent = None if span is None else _hop_traceparent(span)

    def answered(self, status: int | None, error: str | None) -> None:
        if self._span is None:
            return
        from opentelemetry.trace import Status, StatusCode
        if status is not None:
            self._span.set_attribute("http.response.status_code", status)
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))


_UNTRACED = PushTrace()


@contextlib.contextmanager
def push_span(envelope: Envelope, subscription: Subscription,
              attempt: int) -> Iterator[PushTrace]:
    """Around one push. A first push is "msgbus push", a later "msgbus retry"."""
    if _tracer is None:
        yield _UNTRACED
        return
    from opentelemetry.trace import SpanKind
    name = "msgbus push" if attempt == 1 else "msgbus retry"
    with _tracer.start_as_current_span(
            name, context=_context_of(envelope), kind=SpanKind.CLIENT, attributes={
                "messaging.system": "msgbus", "messaging.destination.name": envelope.destination,
                "messaging.message.id": envelope.message_id,
                "msgbus.subscription": f"{subscription.destination}/{subscription.name}",
                "msgbus.attempt": attempt}) as span:
        yield PushTrace(span)


@contextlib.contextmanager
def batch_span(name: str, envelopes: Sequence[Envelope]) -> Iterator[None]:
    """Around work on several messages (accepting a request's, publishing a batch): a span
    whose parent is the only message's producer, or linked to each message's producer."""
    if _tracer is None or not envelopes:
        yield
        return
    from opentelemetry.trace import SpanKind
    single = len(envelopes) == 1
    kind = SpanKind.PRODUCER if name == "msgbus publish" else SpanKind.SERVER
    attributes: dict[str, Any] = {"messaging.system": "msgbus",
                                   "messaging.batch.message_count": len(envelopes)}
    if len({e.destination for e in envelopes}) == 1:
        attributes["messaging.destination.name"] = envelopes[0].destination
    with _tracer.start_as_current_span(
            name, context=_context_of(envelopes[0]) if single else None, kind=kind,
            links=None if single else _links(envelopes), attributes=attributes):
        yield
