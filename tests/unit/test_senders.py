"""Both senders (`h1`, `aiohttp`) against a real HTTP server on 127.0.0.1: what a push returns
for a 2xx, a 5xx with Retry-After, a timeout and a refused connection, and what the subscriber
receives (the exact body and the signed headers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web
from msgbus_devtools.servers import free_port

from msgbus.delivery.batch import batches_of
from msgbus.delivery.sender import Sender
from msgbus.delivery.senders import make_sender
from msgbus.delivery.signing import sign
from msgbus.ids import uuid7
from msgbus.models import Envelope, Subscription
from msgbus.settings import PushSettings

HOST = "127.0.0.1"
SLOW_ANSWER_S = 1.0
LONG_ANSWER = "é".encode() + b"<b>upstream</b>" * 20_000  # 300 KB
# What a refused connect raises, per sender: the error text starts with it.
CONNECT_ERRORS = {"aiohttp": "ClientConnectorError", "h1": "ConnectionRefusedError"}


@dataclass
class Server:
    url: str
    received: dict[str, tuple[dict[str, str], bytes]] = field(default_factory=dict)


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[Server]:
    """aiohttp on 127.0.0.1, a free port: /ok -> 200, /fail -> 500 with `Retry-After: 7`,
    /busy -> 503 with an HTTP-date Retry-After, /slow -> 200 after SLOW_ANSWER_S."""
    received: dict[str, tuple[dict[str, str], bytes]] = {}

    async def record(request: web.Request) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        # a batch push has no ce- headers: its webhook-id is the batch's id
        received[headers.get("ce-id") or headers["webhook-id"]] = (headers, await request.read())

    async def ok(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=200, text="ok")

    async def fail(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=500, text="boom", headers={"Retry-After": "7"})

    async def busy(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=503, headers={"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"})

    async def long_answer(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=502, body=LONG_ANSWER)

    async def slow(request: web.Request) -> web.Response:
        await record(request)
        await asyncio.sleep(SLOW_ANSWER_S)
        return web.Response(status=200, text="late")

    app = web.Application()
    app.add_routes([web.post("/ok", ok), web.post("/fail", fail), web.post("/busy", busy),
                    web.post("/slow", slow), web.post("/long", long_answer)])
    runner = web.AppRunner(app, shutdown_timeout=SLOW_ANSWER_S + 1)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    yield Server(f"http://{HOST}:{port}", received)
    await runner.cleanup()


@pytest.fixture(params=["aiohttp", "h1"])
async def sender(request: pytest.FixtureRequest) -> AsyncIterator[Sender]:
    sender = make_sender(request.param, instance="test-1", push=PushSettings())
    await sender.start()
    yield sender
    await sender.close()


def subscription(url: str, timeout_ms: int = 5000) -> Subscription:
    return Subscription(destination="orders", name="billing", url=url,  # type: ignore[arg-type]
                        timeout_ms=timeout_ms)


def envelope() -> Envelope:
    return Envelope(message_id=uuid7(), destination="orders", biz_id="o-42", source_app="shop",
                    body='{"order": 42, "name": "Zoë"}'.encode())


def kind(sender: Sender) -> str:
    return {"H1Sender": "h1"}.get(type(sender).__name__, "aiohttp")


async def test_2xx_is_ok_and_the_request_is_signed_with_the_exact_body(
        server: Server, sender: Sender) -> None:
    sub, env = subscription(f"{server.url}/ok"), envelope()
    result = await sender.push(env, sub, attempt=3)
    assert result.ok and result.status_code == 200 and result.error is None
    assert (result.message_id, result.subscription, result.attempt, result.instance) == (
        env.message_id, sub.id, 3, "test-1")
    assert result.retry_after_s is None and result.latency_ms > 0
    headers, body = server.received[env.message_id]
    assert body == env.body
    assert headers["ce-id"] == headers["webhook-id"] == env.message_id
    assert headers["ce-attempt"] == "3" and headers["ce-bizid"] == "o-42"
    assert headers["content-type"] == env.content_type
    timestamp = int(headers["webhook-timestamp"])
    assert headers["webhook-signature"] == sign(sub.signing_secrets, env.message_id, timestamp,
                                                env.body)


async def test_500_is_an_error_with_status_and_retry_after(
        server: Server, sender: Sender) -> None:
    result = await sender.push(envelope(), subscription(f"{server.url}/fail"), attempt=1)
    assert not result.ok
    assert (result.status_code, result.error, result.retry_after_s) == (500, "HTTP 500", 7.0)


async def test_retry_after_as_a_date_is_left_to_the_policy(
        server: Server, sender: Sender) -> None:
    result = await sender.push(envelope(), subscription(f"{server.url}/busy"), attempt=1)
    assert (result.status_code, result.error, result.retry_after_s) == (503, "HTTP 503", None)


async def test_timeout_is_an_error_and_the_sender_still_works(
        server: Server, sender: Sender) -> None:
    result = await sender.push(envelope(), subscription(f"{server.url}/slow", timeout_ms=100),
                               attempt=1)
    assert not result.ok and result.status_code is None
    assert result.error == "timeout after 100 ms"
    assert 90 <= result.latency_ms < SLOW_ANSWER_S * 1000
    after = await sender.push(envelope(), subscription(f"{server.url}/ok"), attempt=1)
    assert after.ok, after.error


async def test_refused_connection_is_a_connection_error(sender: Sender) -> None:
    result = await sender.push(envelope(), subscription(f"http://{HOST}:{free_port()}/hook"),
                               attempt=1)
    assert not result.ok and result.status_code is None and result.error is not None
    assert result.error.startswith(CONNECT_ERRORS[kind(sender)]), result.error


async def test_many_concurrent_pushes_all_arrive(server: Server, sender: Sender) -> None:
    sub = subscription(f"{server.url}/ok")
    envelopes = [envelope() for _ in range(50)]
    results = await asyncio.gather(*(sender.push(e, sub, attempt=1) for e in envelopes))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert all(server.received[e.message_id][1] == e.body for e in envelopes)


async def test_a_batch_is_one_signed_post_and_each_message_gets_its_result(
        server: Server, sender: Sender) -> None:
    sub = subscription(f"{server.url}/ok").model_copy(update={"batch_max_messages": 10})
    envelopes = [envelope() for _ in range(3)]
    [batch] = batches_of([(e, 2) for e in envelopes], sub)
    results = await sender.push_batch(batch, sub)
    assert [r.message_id for r in results] == [e.message_id for e in envelopes]
    assert all(r.ok and r.batch_id == batch.batch_id and r.attempt == 2 for r in results)
    headers, body = server.received[batch.batch_id]
    assert headers["content-type"] == "application/cloudevents-batch+json"
    assert headers["webhook-signature"] == sign(
        sub.signing_secrets, batch.batch_id, int(headers["webhook-timestamp"]), body)
    assert [event["id"] for event in orjson.loads(body)] == [e.message_id for e in envelopes]


async def test_a_failed_batch_fails_each_of_its_messages(server: Server, sender: Sender) -> None:
    sub = subscription(f"{server.url}/fail").model_copy(update={"batch_max_messages": 10})
    [batch] = batches_of([(envelope(), 1), (envelope(), 1)], sub)
    results = await sender.push_batch(batch, sub)
    assert [(r.status_code, r.retry_after_s, r.batch_id) for r in results] == [
        (500, 7.0, batch.batch_id)] * 2


def test_unknown_client_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown HTTP client"):
        make_sender("requests", instance="x", push=PushSettings())


async def test_a_failed_push_keeps_the_first_bytes_of_the_answer_a_2xx_none(
        server: Server, sender: Sender) -> None:
    ok = await sender.push(envelope(), subscription(f"{server.url}/ok"), attempt=1)
    assert ok.answer is None
    failed = await sender.push(envelope(), subscription(f"{server.url}/fail"), attempt=1)
    assert failed.answer == "boom" and failed.error == "HTTP 500"
    long = await sender.push(envelope(), subscription(f"{server.url}/long"), attempt=1)
    assert long.status_code == 502 and long.answer == LONG_ANSWER[:1024].decode()
    # whatever was left unread of the long answer, the next push goes through
    again = await sender.push(envelope(), subscription(f"{server.url}/ok"), attempt=1)
    assert again.ok
    batched = subscription(f"{server.url}/long").model_copy(update={"batch_max_messages": 10})
    [batch] = batches_of([(envelope(), 1), (envelope(), 1)], batched)
    results = await sender.push_batch(batch, batched)
    assert [r.answer for r in results] == [LONG_ANSWER[:1024].decode()] * 2


async def test_no_answer_is_kept_with_a_keep_of_zero(server: Server) -> None:
    for kind_name in ("h1", "aiohttp"):
        sender = make_sender(kind_name, instance="t", push=PushSettings(answer_keep_bytes=0))
        await sender.start()
        try:
            failed = await sender.push(envelope(), subscription(f"{server.url}/long"), 1)
            assert failed.status_code == 502 and failed.answer is None
        finally:
            await sender.close()
