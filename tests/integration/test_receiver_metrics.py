"""The receiver's Prometheus metrics, scraped from /metrics of the running bus after good and
bad requests: rejections by known destination and reason, latency by route template and status
class, and the buffer's size."""

from __future__ import annotations

import httpx
from msgbus_devtools.testkit.bus import RunningBus
from prometheus_client.parser import text_string_to_metric_families

from msgbus.ids import uuid7
from msgbus.settings import ReceiverSettings

SINGLE = "/v1/destinations/{code}/messages"
BATCH = "/v1/messages"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(bus: RunningBus) -> Samples:
    text = httpx.get(f"{bus.receiver_url}/metrics", timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def rejected(samples: Samples, destination: str, reason: str) -> float:
    return value(samples, "msgbus_messages_rejected_total", destination=destination,
                 reason=reason)


def latency_count(samples: Samples, endpoint: str, status: str) -> float:
    return value(samples, "msgbus_receiver_request_seconds_count", endpoint=endpoint,
                 status=status)




def test_rejections_are_counted_by_known_destination_and_reason(
        bus: RunningBus, http: httpx.Client, destination: str, unique: str) -> None:
    unknown = f"nowhere-{unique}"
    before = scrape(bus)
    single = f"/v1/destinations/{destination}/messages"
    assert http.post(single, json={"message_id": uuid7(), "body": 1}).status_code == 202
    assert http.post(single, json={"message_id": "42", "body": 1}).status_code == 422
    assert http.post(single, json={"message_id": uuid7(), "body": 1, "biz_id": ""}
                     ).status_code == 422
    assert http.post(f"/v1/destinations/{unknown}/messages",
                     json={"message_id": uuid7(), "body": 1}).status_code == 404
    assert httpx.post(f"{bus.receiver_url}{single}", json={"message_id": uuid7(), "body": 1},
                      headers={"authorization": "Bearer mbk_wrong"}).status_code == 401
    batch = http.post(BATCH, json={"messages": [
        {"destination": destination, "message_id": uuid7(), "body": 1},
        {"destination": destination, "message_id": uuid7()},
        {"destination": unknown, "message_id": uuid7(), "body": 1}]})
    assert [r["status"] for r in batch.json()["results"]] == [202, 422, 404]
    after = scrape(bus)

    def delta(dest: str, reason: str) -> float:
        return rejected(after, dest, reason) - rejected(before, dest, reason)

    assert delta(destination, "invalid_message") == 3  # two single, one in the batch
    assert delta("", "not_found") == 2
    assert delta("", "unauthorized") == 1
    accepted = ("msgbus_messages_accepted_total", frozenset({("destination", destination)}))
    assert after[accepted] == 2
    # an unknown destination from a URL or a batch never becomes a label value
    assert not any(unknown in label for _, labels in after for _, label in labels)


def test_ingest_latency_is_labelled_by_route_template_and_status_class(
        bus: RunningBus, http: httpx.Client, destination: str) -> None:
    before = scrape(bus)
    single = f"/v1/destinations/{destination}/messages"
    for _ in range(3):
        assert http.post(single, json={"message_id": uuid7(), "body": {}}).status_code == 202
    assert http.post(single, content=b"{nope").status_code == 400
    assert http.post(BATCH, json={"messages": [
        {"destination": destination, "message_id": uuid7(), "body": 1}]}).status_code == 200
    assert http.post(BATCH, json={"messages": []}).status_code == 400
    http.get("/health")
    after = scrape(bus)

    def delta(endpoint: str, status: str) -> float:
        return latency_count(after, endpoint, status) - latency_count(before, endpoint, status)

    assert (delta(SINGLE, "2xx"), delta(SINGLE, "4xx")) == (3, 1)
    assert (delta(BATCH, "2xx"), delta(BATCH, "4xx")) == (1, 1)
    endpoints = {dict(labels).get("endpoint") for name, labels in after
                 if name.startswith("msgbus_receiver_request_seconds")}
    assert endpoints == {SINGLE, BATCH}  # route templates only: no raw path, no /health


def test_buffer_bytes_are_refreshed_on_every_scrape(bus: RunningBus, http: httpx.Client,
                                                    destination: str) -> None:
    assert http.post(f"/v1/destinations/{destination}/messages",
                     json={"message_id": uuid7(), "body": "x" * 10_000}).status_code == 202
    samples = scrape(bus)
    limit = value(samples, "msgbus_local_buffer_bytes", service="receiver", kind="limit")
    used = ("msgbus_local_buffer_bytes", frozenset({("service", "receiver"), ("kind", "used")}))
    assert limit == ReceiverSettings().buffer_max_bytes
    assert used in samples and 0 <= samples[used] < limit
