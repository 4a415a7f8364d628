"""Pushes leave the bus only for addresses the egress policy allows (msgbus/egress.py, issue 40):
internal addresses are refused when a URL is written (422 naming the field) and when a push is
about to connect, after resolving the name (DNS rebinding); redirects are not followed.

The bus of these tests allows loopback, where their subscribers listen; an admin with the
default policy (nothing allowed) runs beside it on the same database."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.subscriber import RecordingSubscriber

from msgbus import __version__
from msgbus.delivery.aiohttp_sender import AiohttpSender
from msgbus.delivery.h1_sender import H1Sender
from msgbus.delivery.sender import BaseSender
from msgbus.egress import EgressPolicy
from msgbus.ids import uuid7
from msgbus.models import AttemptResult, Envelope, Subscription
from msgbus.settings import PushSettings

INTERNAL_URLS = {
    "http://169.254.169.254/latest/meta-data/": "link-local",  # the cloud metadata address
    "http://10.20.30.40/hook": "private",
    "http://[fd00::1]/hook": "unique-local",
    "http://127.0.0.1:8081/hook": "loopback",  # the admin's own
    "http://localhost/hook": "loopback",
}


def test_an_internal_url_is_refused_when_written_and_a_test_push_does_not_reach_it(
        bus: RunningBus) -> None:
    strict = httpx.Client(base_url=bus.start_admin(push=PushSettings(allow_networks="")),
                          headers={"authorization": f"Bearer {bus.admin_token}"}, timeout=10)
    code = f"egress-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    for url, kind in INTERNAL_URLS.items():
        answer = strict.put(f"/v1/destinations/{code}/subscriptions/inside", json={"url": url})
        assert answer.status_code == 422, (url, answer.text)
        assert answer.json()["field"] == "url" and kind in answer.json()["message"], answer.text
    assert strict.get("/v1/subscriptions", params={"destination": code}).json() == []
    team = strict.put(f"/v1/teams/team-{code}",
                      json={"notify_url": "http://169.254.169.254/latest/meta-data/"})
    assert team.status_code == 422 and team.json()["field"] == "notify_url", team.text
    public = strict.put(f"/v1/destinations/{code}/subscriptions/outside",
                        json={"url": "https://93.184.216.34/hook", "paused": True})
    assert public.status_code == 200, public.text

    # a subscription the loopback-allowing admin made: the strict one's test push refuses it
    subscriber = RecordingSubscriber()
    bus.subscribe(code, "local", bus.serve_subscriber(subscriber), paused=True)
    refused = strict.post(f"/v1/destinations/{code}/subscriptions/local/test").json()
    assert not refused["ok"] and refused["status_code"] is None
    assert "EgressRefused" in refused["error"] and "loopback" in refused["error"], refused
    assert not subscriber.pushes  # no connection was made
    allowed = bus.admin.post(f"/v1/destinations/{code}/subscriptions/local/test").json()
    assert allowed["ok"] and len(subscriber.pushes) == 1, allowed


@dataclass
class Server:
    """An HTTP server on 127.0.0.1 that counts its connections and answers every request with
    `answer`."""

    answer: bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await self._answer_each(reader, writer)

    async def _answer_each(self, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            self.requests.append(head)
            writer.write(self.answer)
            await writer.drain()


@pytest.fixture
async def servers() -> AsyncIterator[tuple[Server, Server]]:
    """A subscriber, and the internal address a redirect from it points to."""
    found = (Server(), Server())
    started = [await asyncio.start_server(s.serve, "127.0.0.1", 0) for s in found]
    for server, started_server in zip(found, started, strict=True):
        server.port = started_server.sockets[0].getsockname()[1]
    yield found
    for started_server in started:
        started_server.close()


SENDERS: dict[str, type[BaseSender]] = {"h1": H1Sender, "aiohttp": AiohttpSender}


@pytest.mark.parametrize("kind", list(SENDERS))
async def test_a_name_that_resolves_inside_at_push_time_is_not_connected_to(
        servers: tuple[Server, Server], kind: str) -> None:
    """hooks.example resolved to 127.0.0.2 (allowed here) when the URL was written, and to
    127.0.0.1 (refused) when the push is made: no connection. Allowed again, the push goes to
    the address the policy checked, and a redirect it answers is not followed."""
    subscriber, elsewhere = servers
    names = {"hooks.example": ["127.0.0.2"]}

    async def resolver(host: str, port: int) -> list[str]:
        return names[host]

    allowed = (ipaddress.ip_network("127.0.0.2/32"),)
    url = f"http://hooks.example:{subscriber.port}/hook"
    assert await EgressPolicy(allowed, resolver=resolver).url_refusal(url) is None
    names["hooks.example"] = ["127.0.0.1"]  # the name is pointed inside afterwards
    refused = await _push(SENDERS[kind], EgressPolicy(allowed, resolver=resolver), url)
    assert not refused.ok and refused.status_code is None
    assert refused.error is not None and "loopback" in refused.error, refused.error
    assert subscriber.connections == 0

    loopback = (ipaddress.ip_network("127.0.0.1/32"),)
    reached = await _push(SENDERS[kind], EgressPolicy(loopback, resolver=resolver), url)
    assert reached.ok, reached.error
    assert f"host: hooks.example:{subscriber.port}".encode() in subscriber.requests[0].lower()
    assert f"user-agent: msgbus/{__version__}".encode() in subscriber.requests[0].lower()

    subscriber.answer = (f"HTTP/1.1 307 Temporary Redirect\r\nlocation: "
                         f"http://127.0.0.1:{elsewhere.port}/x\r\ncontent-length: 0\r\n\r\n"
                         ).encode()
    redirected = await _push(SENDERS[kind], EgressPolicy(loopback, resolver=resolver), url)
    assert redirected.status_code == 307 and not redirected.ok
    assert elsewhere.connections == 0


async def _push(kind: type[BaseSender], policy: EgressPolicy, url: str) -> AttemptResult:
    sender = kind(instance="egress-test", egress=policy)
    await sender.start()
    try:
        sub = Subscription(destination="orders", name="billing", url=url,  # type: ignore[arg-type]
                           timeout_ms=2000)
        envelope = Envelope(message_id=uuid7(), destination="orders", body=b'{"n": 1}')
        return await sender.push(envelope, sub, attempt=1)
    finally:
        await sender.close()
