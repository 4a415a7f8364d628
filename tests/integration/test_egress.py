"""Pushes leave the bus only for addresses the egress policy allows (msgbus/egress.py, issue 40):
internal addresses are refused when a URL is written (422 naming the field) and when a push is
about to connect, after resolving the name (DNS rebinding); redirects are not followed.

The bus of these tests allows loopback, where their subscribers listen; an admin with the
default policy (nothing allowed) runs beside it on the same database."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from msgbus_devtools.servers import free_port, stop, wait_for_port
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.certs import TestCa
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus import __version__
from msgbus.delivery.aiohttp_sender import AiohttpSender
from msgbus.delivery.h1_sender import H1Sender
from msgbus.delivery.sender import BaseSender
from msgbus.delivery.senders import make_sender
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


@pytest.mark.parametrize("kind", list(SENDERS))
async def test_an_internal_ip_address_in_the_url_is_not_connected_to(
        servers: tuple[Server, Server], kind: str) -> None:
    """No name to resolve: the address itself is checked (aiohttp connects to an IP literal
    without asking its resolver)."""
    subscriber, _ = servers
    only_another = EgressPolicy((ipaddress.ip_network("127.0.0.2/32"),))
    refused = await _push(SENDERS[kind], only_another,
                          f"http://127.0.0.1:{subscriber.port}/hook")
    assert not refused.ok and refused.error is not None and "loopback" in refused.error
    assert subscriber.connections == 0


@pytest.fixture
def proxy_log(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real HTTP proxy (proxy.py, from PyPI) on 127.0.0.1: its URL and its access log."""
    port, log = free_port(), tmp_path / "proxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("proxy")), "--hostname", "127.0.0.1",
             "--port", str(port), "--num-workers", "1", "--num-acceptors", "1",
             "--log-level", "INFO"], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", port, 30)
        yield f"http://127.0.0.1:{port}", log
    finally:
        stop(process.pid)


async def test_pushes_go_through_the_company_proxy_but_for_the_no_proxy_hosts(
        servers: tuple[Server, Server], proxy_log: tuple[str, Path], tmp_path: Path) -> None:
    """Plain http is relayed by the proxy, https is tunnelled through it (with the
    subscription's client certificate and CA), a no-proxy host is reached directly, and a
    refused address never reaches the proxy."""
    proxy, log = proxy_log
    plain, _ = servers
    ca = TestCa()
    cert, key = ca.server().write(tmp_path, "server")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    tls.load_verify_locations(cadata=ca.pem)
    tls.verify_mode = ssl.CERT_REQUIRED  # mutual TLS, through the tunnel
    secure = Server()
    started = await asyncio.start_server(secure.serve, "127.0.0.1", 0, ssl=tls)
    secure.port = started.sockets[0].getsockname()[1]
    client = ca.client()
    push = PushSettings(allow_networks="127.0.0.0/8", proxy=proxy, no_proxy="localhost")
    sender = make_sender("h1", instance="proxy-test", push=push)
    await sender.start()
    try:
        envelope = Envelope(message_id=uuid7(), destination="orders", body=b'{"n": 1}')

        async def push_to(url: str, **settings: Any) -> AttemptResult:
            sub = Subscription(destination="orders", name="billing", url=url,  # type: ignore[arg-type]
                               timeout_ms=5000, **settings)
            return await sender.push(envelope, sub, attempt=1)

        relayed = await push_to(f"http://127.0.0.1:{plain.port}/hook")
        tunnelled = await push_to(f"https://127.0.0.1:{secure.port}/hook", auth={"tls": {
            "client_cert": client.cert, "client_key": client.key, "ca_bundle": ca.pem}})
        direct = await push_to(f"http://localhost:{plain.port}/direct")
        refused = await push_to("http://10.20.30.40/hook")
    finally:
        await sender.close()
        started.close()
    assert relayed.ok and tunnelled.ok and direct.ok, (relayed, tunnelled, direct)
    assert refused.error is not None and "private" in refused.error
    assert len(plain.requests) == 2 and len(secure.requests) == 1

    relayed_line = f"POST 127.0.0.1:{plain.port}/hook"
    tunnel_line = f"CONNECT 127.0.0.1:{secure.port}"
    def logged() -> str | None:
        text = log.read_text()
        return text if relayed_line in text and tunnel_line in text else None

    text = await eventually_async(logged, 10, "the proxy's access log lines of both pushes")
    assert "/direct" not in text and "10.20.30.40" not in text
