"""W3C trace context end to end, on real services: the producer's span (an OpenTelemetry span
current around send(), a traceparent stated in the JSON envelope or the raw form's request
headers) reaches every push, first and retried, as `traceparent` and `ce-traceparent`; the
admin's timeline shows the trace id; with tracing on, the push carries its own span, a child
of the producer's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from msgbus_client import MsgbusClient
from msgbus_client.verify import verify_push
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from msgbus import telemetry
from msgbus.ids import uuid7

pytestmark = pytest.mark.integration

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "vendor=abc,other=1"
QUICK_RETRY = {"retry_policy": {"delays_s": [0.2]}}


def _pushes_of(subscriber: RecordingSubscriber, message_id: str) -> list[dict[str, str]]:
    return [push.headers for push in subscriber.pushes if push.headers["ce-id"] == message_id]


@pytest.fixture
def destination(bus: RunningBus, unique: str) -> str:
    code = f"traced-{unique}"
    bus.create_destination(code, "kafka")
    return code


def test_the_senders_span_reaches_first_pushes_and_retries(
        bus: RunningBus, api_key: str, spool_dir: Path, destination: str) -> None:
    subscriber = bus.subscribe_recorder(destination, "sub", **QUICK_RETRY)
    subscriber.status = 503  # every first push fails: the compensator's retry must carry it too
    tracer = TracerProvider().get_tracer("producer")
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    with tracer.start_as_current_span("place order") as span:
        traced_id = client.send(destination, {"order": 1})
        producer = span.get_span_context()
    stated_id = client.send(destination, {"order": 2}, traceparent=PARENT, tracestate=STATE)
    untraced_id = client.send(destination, {"order": 3})
    assert client.close(30) == 0
    eventually(lambda: all(_pushes_of(subscriber, i) for i in (traced_id, stated_id)), 30,
               "the first pushes")
    subscriber.status = 200
    eventually(lambda: len(_pushes_of(subscriber, traced_id)) >= 2
               and len(_pushes_of(subscriber, stated_id)) >= 2, 60, "the retries")

    expected = (f"00-{producer.trace_id:032x}-{producer.span_id:016x}"
                f"-{producer.trace_flags:02x}")
    for headers in _pushes_of(subscriber, traced_id):
        assert headers["traceparent"] == headers["ce-traceparent"] == expected
        assert "tracestate" not in headers
    for headers in _pushes_of(subscriber, stated_id):
        assert headers["traceparent"] == headers["ce-traceparent"] == PARENT
        assert headers["tracestate"] == headers["ce-tracestate"] == STATE
    assert all("traceparent" not in h for h in _pushes_of(subscriber, untraced_id))

    detail = bus.admin.get(f"/v1/messages/{stated_id}").json()
    assert detail["message"]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert detail["message"]["traceparent"] == PARENT


def test_the_raw_form_and_a_batch_take_the_requests_trace_context(
        bus: RunningBus, api_key: str, destination: str) -> None:
    subscriber = bus.subscribe_recorder(destination, "raw")
    auth = {"authorization": f"Bearer {api_key}"}
    raw_id, batch_id, own_id = uuid7(), uuid7(), uuid7()
    answer = httpx.post(
        f"{bus.receiver_url}/v1/destinations/{destination}/messages", content=b"\x00\x01",
        headers={**auth, "content-type": "application/octet-stream", "ce-id": raw_id,
                 "ce-bizid": "订单 42".encode(), "traceparent": PARENT, "tracestate": STATE})
    assert answer.status_code == 202, answer.text
    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    answer = httpx.post(f"{bus.receiver_url}/v1/messages", headers={**auth, "traceparent": PARENT},
                        json={"messages": [
                            {"destination": destination, "message_id": batch_id, "body": 1},
                            {"destination": destination, "message_id": own_id, "body": 2,
                             "traceparent": other}]})
    assert [r["status"] for r in answer.json()["results"]] == [202, 202], answer.text
    eventually(lambda: all(_pushes_of(subscriber, i) for i in (raw_id, batch_id, own_id)), 30,
               "the pushes")
    [raw] = _pushes_of(subscriber, raw_id)
    assert raw["ce-traceparent"] == PARENT and raw["ce-tracestate"] == STATE
    assert raw["ce-bizid"] == "%E8%AE%A2%E5%8D%95%2042"  # the CloudEvents HTTP binding's encoding
    assert _pushes_of(subscriber, batch_id)[0]["ce-traceparent"] == PARENT
    assert _pushes_of(subscriber, own_id)[0]["ce-traceparent"] == other


@pytest.mark.parametrize(("fields", "field"), [
    ({"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}, "traceparent"),
    ({"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, "traceparent"),
    ({"tracestate": "a=b"}, "tracestate"),
    ({"traceparent": PARENT, "tracestate": "a=\u00e9"}, "tracestate"),
])
def test_a_stated_trace_context_that_cannot_be_used_is_a_422(
        bus: RunningBus, api_key: str, destination: str, fields: dict[str, str],
        field: str) -> None:
    answer = httpx.post(
        f"{bus.receiver_url}/v1/destinations/{destination}/messages",
        headers={"authorization": f"Bearer {api_key}"},
        json={"message_id": uuid7(), "body": {}, **fields})
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field


def test_an_invalid_request_traceparent_is_ignored(
        bus: RunningBus, api_key: str, destination: str) -> None:
    subscriber = bus.subscribe_recorder(destination, "lenient")
    message_id = uuid7()
    answer = httpx.post(
        f"{bus.receiver_url}/v1/destinations/{destination}/messages",
        headers={"authorization": f"Bearer {api_key}", "traceparent": "not-a-trace"},
        json={"message_id": message_id, "body": {}})
    assert answer.status_code == 202, answer.text
    eventually(lambda: _pushes_of(subscriber, message_id), 30, "the push")
    assert "traceparent" not in _pushes_of(subscriber, message_id)[0]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process (the session's bus runs in it) for one test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(telemetry, "_tracer", provider.get_tracer("msgbus"))
        yield exporter


def test_with_tracing_on_each_push_is_a_span_of_the_producers_trace(
        bus: RunningBus, api_key: str, spool_dir: Path, destination: str,
        spans: InMemorySpanExporter) -> None:
    subscription = bus.subscribe(destination, "spans", bus.serve_subscriber(
        subscriber := RecordingSubscriber()))
    bus.wait_for_workers([f"{destination}/spans"])
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    message_id = client.send(destination, {"order": 1}, traceparent=PARENT)
    assert client.close(30) == 0
    eventually(lambda: _pushes_of(subscriber, message_id), 30, "the push")
    [headers] = _pushes_of(subscriber, message_id)
    verify_push(str(subscription["signing_secrets"][0]), headers,
                subscriber.pushes[-1].body)

    def named(name: str) -> list[object]:
        return [s for s in spans.get_finished_spans() if s.name == name
                and s.attributes.get("messaging.message.id", message_id) == message_id]

    eventually(lambda: named("msgbus push") and named("msgbus accept"), 10, "the spans")
    [push] = named("msgbus push")
    context = push.context  # type: ignore[attr-defined]
    assert headers["ce-traceparent"] == PARENT  # the creation context, unchanged
    assert headers["traceparent"] == (f"00-{context.trace_id:032x}-{context.span_id:016x}"
                                      f"-{context.trace_flags:02x}")
    assert f"{context.trace_id:032x}" == PARENT[3:35]
    assert f"{push.parent.span_id:016x}" == PARENT[36:52]  # type: ignore[attr-defined]
    assert push.attributes["http.response.status_code"] == 200  # type: ignore[attr-defined]
