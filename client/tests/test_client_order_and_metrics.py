"""First delivery follows send order across an outage; the client's metrics tell what happened;
group commit's edge cases (a lone sender, bad input, close) behave."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from client_testkit import API_KEY, StubReceiver, eventually, free_port

from msgbus_client import InvalidMessageError, MsgbusClient, SpoolFullError
from msgbus_client.metrics import PrometheusCollector, register_prometheus

MakeClient = Callable[..., MsgbusClient]


def _first_seen(ids: list[str]) -> list[str]:
    seen: set[str] = set()
    return [i for i in ids if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]


def test_sends_during_and_after_an_outage_arrive_in_send_order(make_client: MakeClient) -> None:
    receiver = StubReceiver(port=free_port())  # down
    client = make_client(receiver.url, max_batch_messages=7)
    ids = [client.send("orders", {"n": n}) for n in range(40)]
    receiver.start()
    try:
        # keep sending while the resender works off the backlog: no new message may overtake it
        ids += [client.send("orders", {"n": n}) for n in range(40, 120)]
        eventually(lambda: set(receiver.ids()) == set(ids))
        assert _first_seen(receiver.ids()) == ids
        eventually(lambda: client.spool.pending_count() == 0)
        # once the backlog is gone, send() delivers inline again
        eventually(lambda: not client._backlog)
        before = len(receiver.attempts)
        last = client.send("orders", {"n": "inline"})
        assert receiver.ids()[-1] == last
        assert receiver.attempts[before].endpoint == "single"
    finally:
        receiver.stop()


def test_metrics_count_sends_resends_rejections_and_errors(
    make_client: MakeClient,
) -> None:
    receiver = StubReceiver(port=free_port())
    # a first backoff of 2-4 s: still backing off when the metrics are read on a busy machine
    client = make_client(receiver.url, max_spool_bytes=4000, retry_base_s=4, retry_max_s=4)
    for n in range(5):
        client.send("orders", {"n": n})
    with pytest.raises(InvalidMessageError):
        client.send("orders", {1, 2})  # a set is not JSON
    with pytest.raises(SpoolFullError):
        client.send("orders", "x" * 5000)
    m = client.metrics()
    assert (m.pending, m.rejected, m.backing_off) == (5, 0, True)
    assert m.oldest_age_s is not None and m.oldest_age_s >= 0
    assert m.counters["sent"] == 5
    assert m.counters["failed_requests"] >= 1
    assert m.send_errors == {"InvalidMessageError": 1, "SpoolFullError": 1}

    receiver.set_rule(lambda _, doc: (400, {"error": "bad"}) if doc["body"] == {"n": 3} else None)
    receiver.start()
    try:
        eventually(lambda: client.metrics().pending == 0)
        m = client.metrics()
        assert (m.rejected, m.oldest_age_s, m.backing_off) == (1, None, False)
        assert m.counters["acked"] == 4
        assert m.counters["rejected"] == 1
        assert m.counters["resend_requests"] >= 1
        assert m.counters["resent_messages"] >= 5
    finally:
        receiver.stop()


def test_prometheus_collector_exports_the_client(make_client: MakeClient) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    client = make_client(f"http://127.0.0.1:{free_port()}")
    collector = register_prometheus(client, registry)
    assert isinstance(collector, PrometheusCollector)
    client.send("orders", {"n": 1})
    spool = str(client.spool.path)
    labels = {"spool": spool}
    assert registry.get_sample_value("msgbus_client_spool_pending_messages", labels) == 1
    assert registry.get_sample_value("msgbus_client_messages_sent_total", labels) == 1
    age = registry.get_sample_value("msgbus_client_spool_oldest_message_age_seconds", labels)
    assert age is not None and age >= 0
    text = prometheus_client.generate_latest(registry).decode()
    assert "msgbus_client_resend_attempts_total" in text
    assert "msgbus_client_failed_requests_total" in text


def test_group_commit_lone_sender_bad_input_and_close(make_client: MakeClient) -> None:
    receiver = StubReceiver(port=free_port())
    client = make_client(receiver.url, group_commit_ms=2)
    first = client.send("orders", {"n": 1})  # a lone sender leads its own group
    with pytest.raises(InvalidMessageError):
        client.send("orders", float("nan"))
    errors: list[BaseException] = []
    sent: list[str] = []

    def work() -> None:
        try:
            for n in range(50):
                sent.append(client.send("orders", {"n": n}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert client.spool.pending_count() == 1 + len(sent) == 401
    left = client.close(timeout_s=0)
    assert left == 401  # nothing was lost by close(); the next client sends them

    receiver.start()
    try:
        with MsgbusClient(receiver.url, API_KEY, spool_dir=client.spool.path) as again:
            eventually(lambda: again.spool.pending_count() == 0)
        assert _first_seen(receiver.ids())[0] == first
        assert set(receiver.ids()) == {first, *sent}
    finally:
        receiver.stop()
