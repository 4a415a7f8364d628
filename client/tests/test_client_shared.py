"""What the sync and async clients share: one set of options and settings, one exchange with the
receiver, one resend plan."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from client_testkit import API_KEY, free_port

from msgbus_client import AsyncMsgbusClient, ClientSettings, MsgbusClient
from msgbus_client.delivery import Backlog, Exchange, InFlight
from msgbus_client.message import Entry, build_entry
from msgbus_client.protocol import BATCH_PATH, PostResult
from msgbus_client.resender import ResendPlan
from msgbus_client.retry import ReceiverHealth
from msgbus_client.settings import ClientOptions
from msgbus_client.spool import Spool

# every option, none at its default
OPTIONS: dict[str, Any] = {
    "max_slots": 3,
    "group_commit_ms": 1.5,
    "max_group_messages": 7,
    "max_spool_bytes": 5_000_000,
    "inline_send": False,
    "max_inline_requests": 4,
    "request_timeout_s": 2.5,
    "connect_timeout_s": 0.5,
    "retry_base_s": 0.1,
    "retry_max_s": 2.0,
    "max_retry_after_s": 60.0,
    "max_batch_messages": 9,
    "max_batch_bytes": 9_000,
    "idle_poll_s": 0.25,
    "validate": True,
    "schema_ttl_s": 30.0,
}


def test_the_options_are_the_settings_fields() -> None:
    fields = {f.name for f in dataclasses.fields(ClientSettings)}
    assert set(ClientOptions.__optional_keys__) == fields - {
        "receiver_url",
        "spool_dir",
        "spool_root",
    }
    assert set(OPTIONS) == set(ClientOptions.__optional_keys__)


async def test_both_clients_take_every_option_into_the_same_settings(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    sync = MsgbusClient(url, API_KEY, spool_dir=str(tmp_path / "sync"), **OPTIONS)
    aio = AsyncMsgbusClient(url, API_KEY, spool_dir=tmp_path / "async", **OPTIONS)
    try:
        assert sync.settings == ClientSettings(
            receiver_url=url, spool_dir=tmp_path / "sync", **OPTIONS
        )
        assert aio.settings == dataclasses.replace(sync.settings, spool_dir=tmp_path / "async")
    finally:
        sync.close(timeout_s=0)
        await aio.close(timeout_s=0)


def test_the_clients_offer_the_same_methods() -> None:
    def public(cls: type) -> set[str]:
        return {name for name in dir(cls) if not name.startswith("_")}

    assert public(AsyncMsgbusClient) - public(MsgbusClient) == {"start"}
    assert public(MsgbusClient) <= public(AsyncMsgbusClient)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"retry_base_s": 0}, ValueError),
        ({"group_commit_ms": -1}, ValueError),
        ({"spool_root": "/tmp/elsewhere"}, ValueError),  # and spool_dir: one of them only
        ({"no_such_option": 1}, TypeError),
    ],
)
def test_bad_options_are_refused_before_the_spool_is_opened(
    spool_dir: Path, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    for cls in (MsgbusClient, AsyncMsgbusClient):
        with pytest.raises(error):
            cls("http://127.0.0.1:1", API_KEY, spool_dir=spool_dir, **kwargs)
    assert not spool_dir.exists()


def test_an_empty_api_key_leaves_the_spool_dir_free(spool_dir: Path) -> None:
    with pytest.raises(ValueError, match="api_key"):
        MsgbusClient("http://127.0.0.1:1", "", spool_dir=spool_dir)
    MsgbusClient("http://127.0.0.1:1", API_KEY, spool_dir=spool_dir).close(timeout_s=0)


# -- the exchange: which requests deliver some entries, and what the answers mean ----------------


def test_exchange_sends_one_entry_to_the_single_endpoint() -> None:
    entry = build_entry("orders", 1)
    exchange = Exchange([entry])
    assert exchange.request is not None
    assert exchange.request.path == "/v1/destinations/orders/messages"
    exchange.answer(PostResult(status=422, body=b'{"error": "bad"}'))
    assert exchange.request is None
    assert exchange.outcome.rejected == [(entry, 422, {"error": "bad"})]


def test_exchange_falls_back_to_single_sends_until_one_is_not_settled() -> None:
    entries = [build_entry("orders", n) for n in range(4)]
    exchange = Exchange(entries)
    assert exchange.request is not None and exchange.request.path == BATCH_PATH
    exchange.answer(PostResult(status=413))  # the batch as a whole refused: one by one
    sent: list[Entry] = []
    for status in (202, 422, 503):
        assert exchange.request is not None and exchange.request.path != BATCH_PATH
        sent.extend(exchange.request.entries)
        exchange.answer(PostResult(status=status, retry_after_s=3.0))
    assert exchange.request is None
    assert sent == entries[:3]
    outcome = exchange.outcome
    assert outcome.acked == entries[:1]
    assert [rejected[0] for rejected in outcome.rejected] == entries[1:2]
    assert outcome.retry == entries[2:]  # the failed one and the untried rest
    assert outcome.retry_after_s == 3.0


def test_exchange_of_a_batch_answer() -> None:
    entries = [build_entry("orders", n) for n in range(2)]
    exchange = Exchange(entries)
    body = (
        b'{"results": [{"message_id": "%s", "status": 202}, {"message_id": "%s", "status": 429}]}'
        % (entries[0].message_id.encode(), entries[1].message_id.encode())
    )
    exchange.answer(PostResult(status=200, body=body))
    assert exchange.request is None
    assert (exchange.outcome.acked, exchange.outcome.retry) == (entries[:1], entries[1:])


# -- the resend plan -----------------------------------------------------------------------------


def _plan(tmp_path: Path, health: ReceiverHealth) -> tuple[ResendPlan, Spool]:
    settings = ClientSettings(receiver_url="http://x", spool_dir=tmp_path, max_batch_messages=2)
    spool = Spool(tmp_path)
    return ResendPlan(settings, health, Backlog(present=True), spool, InFlight()), spool


def test_resend_plan_waits_out_the_backoff_and_gives_up_a_flush_it_would_overrun(
    tmp_path: Path,
) -> None:
    health = ReceiverHealth(base_s=10, max_s=10, max_retry_after_s=10)
    plan, spool = _plan(tmp_path, health)
    try:
        assert plan.next_wait() == 0 and plan.request_timeout() is None
        health.record_failure()  # 5 to 10 s of backoff
        assert 4 < (plan.next_wait() or 0) <= 10
        plan.flush_for(60)
        assert plan.flushing and 4 < (plan.next_wait() or 0) <= 10
        assert 59 < (plan.request_timeout() or 0) <= 60
        plan.flush_for(1)  # the backoff would outlast the flush
        assert plan.next_wait() is None
        health.record_success()
        plan.flush_for(0)
        time.sleep(0.001)  # the clock moving past the deadline is the scenario
        assert plan.next_wait() is None  # the deadline has passed
    finally:
        spool.close()


def test_resend_plan_batches_oldest_first_and_ends_the_backlog_when_empty(
    tmp_path: Path,
) -> None:
    plan, spool = _plan(tmp_path, ReceiverHealth(base_s=1, max_s=1, max_retry_after_s=1))
    try:
        entries = [build_entry("orders", n) for n in range(3)]
        spool.append(entries)
        plan.in_flight.add(entries[0].key)  # a send() is delivering it itself
        assert plan.batch() == entries[1:]
        assert plan.backlog
        spool.settle(entries[1:], [])
        plan.in_flight.discard([entries[0].key])
        spool.settle(entries[:1], [])
        assert plan.batch() == []
        assert not plan.backlog
    finally:
        spool.close()
