"""`H1Sender`'s own HTTP/1.1 handling against a scripted server on 127.0.0.1 (asyncio streams):
connections kept alive and reused, answers framed every way HTTP/1.1 allows, servers that close
or misbehave. The behaviour every sender shares is in test_senders.py."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.delivery import h1_sender
from msgbus.delivery.h1_sender import H1Sender, parse_target
from msgbus.ids import uuid7
from msgbus.models import Envelope, Subscription
from msgbus.settings import PushSettings

HOST = "127.0.0.1"
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@dataclass
class Script:
    """What the server answers to each request (by order of arrival), and what it saw."""

    answers: list[bytes | Callable[[asyncio.StreamWriter], object]] = field(default_factory=list)
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)


async def _serve(script: Script, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    script.connections += 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            script.requests.append(head)
            script.bodies.append(await reader.readexactly(length))
            answer = script.answers.pop(0) if script.answers else OK
            if callable(answer):
                answer(writer)
            else:
                writer.write(answer)
            await writer.drain()
            if writer.is_closing():
                return
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def idle_past_the_keepalive(sender: H1Sender) -> None:
    """Until no idle connection of `sender` may be reused any more and a prune of them is due
    (both: older than the keep-alive)."""
    def expired() -> bool:
        now = time.monotonic()
        return (not any(c.reusable(now) for cs in sender._idle.values() for c in cs)
                and now - sender._pruned_at > h1_sender.KEEPALIVE_S)

    await eventually_async(expired, 5, "the idle connections older than the keep-alive",
                           interval_s=0.01)


@pytest.fixture
async def server() -> AsyncIterator[tuple[Script, str]]:
    script = Script()
    srv = await asyncio.start_server(lambda r, w: _serve(script, r, w), HOST, 0)
    port = srv.sockets[0].getsockname()[1]
    yield script, f"http://{HOST}:{port}/hook?x=1"
    srv.close()


@pytest.fixture
async def sender() -> AsyncIterator[H1Sender]:
    sender = H1Sender(instance="test-h1", egress=PushSettings().egress_policy())  # loopback
    await sender.start()
    yield sender
    await sender.close()


def subscription(url: str) -> Subscription:
    return Subscription(destination="orders", name="billing", url=url,  # type: ignore[arg-type]
                        timeout_ms=2000)


def envelope(**headers: str) -> Envelope:
    return Envelope(message_id=uuid7(), destination="orders", body=b'{"n": 1}', headers=headers)


def close_after(data: bytes) -> Callable[[asyncio.StreamWriter], object]:
    def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        writer.close()
    return answer


async def test_sequential_pushes_share_one_kept_alive_connection(
        server: tuple[Script, str], sender: H1Sender) -> None:
    script, url = server
    results = [await sender.push(envelope(), subscription(url), attempt=1) for _ in range(5)]
    assert all(r.ok for r in results), [r.error for r in results]
    assert script.connections == 1 and len(script.bodies) == 5
    assert script.requests[0].startswith(b"POST /hook?x=1 HTTP/1.1\r\n")
    assert f"host: {HOST}:".encode() in script.requests[0]
    assert script.bodies[0] == b'{"n": 1}'


async def test_connection_close_answer_is_honoured_and_the_next_push_reconnects(
        server: tuple[Script, str], sender: H1Sender) -> None:
    script, url = server
    script.answers = [b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"]
    first = await sender.push(envelope(), subscription(url), attempt=1)
    second = await sender.push(envelope(), subscription(url), attempt=1)
    assert (first.status_code, second.status_code) == (201, 200)
    assert script.connections == 2


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 202 Accepted\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 429 Too Many\r\nRetry-After: 12\r\ncontent-length: 4\r\n\r\nslow",
], ids=["chunked", "interim-100", "retry-after"])
async def test_answers_framed_every_way_are_read_and_the_connection_reused(
        server: tuple[Script, str], sender: H1Sender, answer: bytes) -> None:
    script, url = server
    script.answers = [answer]
    first = await sender.push(envelope(), subscription(url), attempt=1)
    assert first.status_code in (202, 204, 429)
    if first.status_code == 429:
        assert first.retry_after_s == 12.0 and first.error == "HTTP 429"
    after = await sender.push(envelope(), subscription(url), attempt=1)
    assert after.ok and script.connections == 1


async def test_an_answer_whose_body_runs_until_the_server_closes_completes(
        server: tuple[Script, str], sender: H1Sender) -> None:
    script, url = server
    script.answers = [close_after(b"HTTP/1.0 200 OK\r\n\r\nthe body, unframed")]
    result = await sender.push(envelope(), subscription(url), attempt=1)
    assert result.ok, result.error


@pytest.mark.parametrize(("answer", "error"), [
    (close_after(b""), "ConnectionResetError: the server closed the connection without"),
    (close_after(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"),
     "ProtocolError: the server closed the connection in the middle"),
    (b"SMTP ready\r\n\r\n", "ProtocolError: invalid HTTP answer"),
], ids=["closed-silently", "closed-mid-body", "not-http"])
async def test_a_broken_answer_is_a_failed_attempt_and_the_sender_recovers(
        server: tuple[Script, str], sender: H1Sender, answer: bytes, error: str) -> None:
    script, url = server
    script.answers = [answer]
    result = await sender.push(envelope(), subscription(url), attempt=1)
    assert not result.ok and result.status_code is None
    assert result.error is not None and result.error.startswith(error), result.error
    after = await sender.push(envelope(), subscription(url), attempt=1)
    assert after.ok, after.error


async def test_idle_connections_older_than_the_keepalive_are_not_reused(
        server: tuple[Script, str], sender: H1Sender, monkeypatch: pytest.MonkeyPatch) -> None:
    script, url = server
    monkeypatch.setattr(h1_sender, "KEEPALIVE_S", 0.05)
    assert (await sender.push(envelope(), subscription(url), attempt=1)).ok
    await idle_past_the_keepalive(sender)
    assert (await sender.push(envelope(), subscription(url), attempt=1)).ok
    assert script.connections == 2


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
        server: tuple[Script, str], sender: H1Sender) -> None:
    script, url = server
    result = await sender.push(envelope(trace="a\r\nx-evil: 1"), subscription(url), attempt=1)
    assert not result.ok and result.error is not None and "line break" in result.error
    assert script.connections == 0


def test_targets_are_parsed_with_default_ports_and_ipv6_hosts() -> None:
    target = parse_target("https://hooks.example.com/in")
    assert (target.origin.port, target.path, target.host_header) == (
        443, "/in", "hooks.example.com")
    v6 = parse_target("http://[::1]:8080")
    assert (v6.origin.host, v6.path, v6.host_header) == ("::1", "/", "[::1]:8080")
    with pytest.raises(ValueError, match="not an http"):
        parse_target("ftp://example.com/x")


async def test_connections_to_an_origin_no_longer_pushed_to_are_closed_and_forgotten(
        server: tuple[Script, str], sender: H1Sender, monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = server
    other = Script()
    srv = await asyncio.start_server(lambda r, w: _serve(other, r, w), HOST, 0)
    other_url = f"http://{HOST}:{srv.sockets[0].getsockname()[1]}/gone"
    monkeypatch.setattr(h1_sender, "KEEPALIVE_S", 0.05)
    assert (await sender.push(envelope(), subscription(other_url), attempt=1)).ok
    await idle_past_the_keepalive(sender)
    assert (await sender.push(envelope(), subscription(url), attempt=1)).ok
    assert [origin.port for origin, _ in sender._idle] == [parse_target(url).origin.port]
    srv.close()


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_https_subscribers_get_tls_and_an_untrusted_certificate_is_refused(
        sender: H1Sender, self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    script = Script()
    srv = await asyncio.start_server(lambda r, w: _serve(script, r, w), HOST, 0, ssl=tls)
    url = f"https://{HOST}:{srv.sockets[0].getsockname()[1]}/hook"
    result = await sender.push(envelope(), subscription(url), attempt=1)
    srv.close()
    assert not result.ok and result.error is not None
    assert result.error.startswith("SSLCertVerificationError"), result.error
    assert script.bodies == []
