"""`H1Sender`: the `Sender` on a lean HTTP/1.1 client of its own — asyncio protocols, kept-alive
connections per origin and httptools' response parser (llhttp, the parser uvicorn uses).

Why: at saturation aiohttp's client was two thirds of the dispatcher's event loop (py-spy), most
of it in per-request objects this job never uses (cookies, redirects, tracing, multidicts). A
push is one POST with a small body whose answer is read for its status and `Retry-After` only,
so this client writes one buffer per request and parses the answer in C (keeping the first
bytes of a failed push's body only). Figures:
`python -m bench.senders` (pushes per CPU-second against raw aiohttp in the same run).

Behaviour matches `AiohttpSender`: no proxy from the environment, no redirects followed, TLS
verified by the default context, idle connections closed after `KEEPALIVE_S` (before common
servers close theirs: uvicorn 5 s), a POST never retried by the client (the retry policy
decides), `max_connections` requests in flight at most.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from msgbus.delivery.sender import USER_AGENT, BaseSender
from msgbus.egress import EgressPolicy
from msgbus.sealing import SecretKeys

KEEPALIVE_S = 4.0


class ProtocolError(Exception):
    """The subscriber's server answered something that is not HTTP/1.1, or closed the
    connection in the middle of its answer."""


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Target:
    origin: Origin
    path: str  # request target: path and query
    host_header: str


@functools.lru_cache(maxsize=4096)
def parse_target(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    default_port = 443 if parts.scheme == "https" else 80
    port = parts.port or default_port
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.hostname
    host_header = f"[{host}]" if ":" in host else host
    if port != default_port:
        host_header = f"{host_header}:{port}"
    return Target(Origin(parts.scheme, host, port), path, host_header)


def encode_request(target: Target, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {target.path} HTTP/1.1\r\nhost: {target.host_header}\r\n"
             f"user-agent: {USER_AGENT}\r\ncontent-length: {len(body)}\r\n"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode() + body


Answer = tuple[int, str | None, bytes | None]  # status, Retry-After, the kept body
Pool = tuple[Origin, ssl.SSLContext | None]


class Connection(asyncio.Protocol):
    """One kept-alive connection; one request at a time (no pipelining). Of a failed push's
    answer, it keeps the first `answer_keep_bytes` of the body; a longer body is not read
    further (the connection closes)."""

    def __init__(self, answer_keep_bytes: int = 0, closed_hint: str = "") -> None:
        self._closed_hint = closed_hint  # said when the server closes without answering
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[Answer] | None = None
        self._status: int | None = None
        self._retry_after: str | None = None
        self._body_framed = False  # content-length or chunked: else the body ends at EOF
        self._keep_bytes = answer_keep_bytes
        self._kept: bytes | None = None  # None: not keeping (a 2xx, or nothing to keep)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"invalid HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._status is not None and not self._body_framed:
            self._finish(self._status)  # an answer whose body runs until the server closes
        elif self._status is not None:
            self._fail(ProtocolError("the server closed the connection in the middle of its "
                                     "answer"))
        else:
            self._fail(exc or ConnectionResetError(
                "the server closed the connection without answering" + self._closed_hint))

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._status, self._retry_after, self._body_framed = None, None, False
        self._kept = None

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"retry-after":
            self._retry_after = value.decode("latin-1").strip()
        elif name in (b"content-length", b"transfer-encoding"):
            self._body_framed = True

    def on_headers_complete(self) -> None:
        self._status = status = self._parser.get_status_code()
        if self._keep_bytes and status >= 300:
            self._kept = b""

    def on_body(self, body: bytes) -> None:
        if self._kept is None:  # the hot path: a 2xx answer's body is dropped
            return
        room = self._keep_bytes - len(self._kept)
        self._kept += body[:room]
        if len(body) > room and self._status is not None:
            self._finish(self._status)  # what is kept is all that is read of it
            self.close()

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the final one follows
            self._status = None
            return
        if not self._parser.should_keep_alive():
            self.close()
        self._finish(status)

    # the client's side
    async def request(self, data: bytes) -> Answer:
        assert self.transport is not None and self._answer is None
        self._answer = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self._answer

    def reusable(self, now: float) -> bool:
        return not self.closed and now - self.idle_since <= KEEPALIVE_S

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _finish(self, status: int) -> None:
        answer, self._answer, self._status = self._answer, None, None
        if answer is None:
            self.close()  # an answer nobody asked for: the connection is out of step
        elif not answer.done():
            answer.set_result((status, self._retry_after, self._kept))

    def _fail(self, exc: BaseException) -> None:
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_exception(exc)


class H1Sender(BaseSender):
    transport_errors = (ProtocolError, ValueError, OSError)

    def __init__(self, *, instance: str, max_connections: int = 1000,
                 answer_keep_bytes: int = 1024, egress: EgressPolicy | None = None,
                 keys: SecretKeys | None = None) -> None:
        super().__init__(instance=instance, max_connections=max_connections,
                         answer_keep_bytes=answer_keep_bytes, egress=egress, keys=keys)
        self._protocol = functools.partial(Connection, answer_keep_bytes)
        # Under TLS 1.3 a server that refuses the client certificate closes the connection
        # after the handshake, and asyncio reports no alert: say what it likely means.
        self._mutual_tls_protocol = functools.partial(
            Connection, answer_keep_bytes, " (with the subscription's TLS settings: this is how "
            "a server refuses a client certificate it does not trust)")
        # by origin and TLS context (a subscription's client certificate is its own pool)
        self._idle: dict[Pool, list[Connection]] = {}  # most recently used last
        self._slots = asyncio.Semaphore(max_connections)
        self._ssl: ssl.SSLContext | None = None
        self._closed = False
        self._pruned_at = time.monotonic()

    async def start(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        await super().close()
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    async def _post(self, url: str, body: bytes, headers: dict[str, str],
                    timeout_s: float, tls: ssl.SSLContext | None = None) -> Answer:
        target = parse_target(url)
        data = encode_request(target, body, headers)
        pool = (target.origin, tls if target.origin.scheme == "https" else None)
        async with asyncio.timeout(timeout_s), self._slots:
            connection = await self._connection(pool)
            try:
                answer = await connection.request(data)
            except BaseException:
                connection.close()  # a timeout or a cancel leaves an answer due on it
                raise
            if not connection.closed and not self._closed:
                connection.idle_since = now = time.monotonic()
                self._idle.setdefault(pool, []).append(connection)
                if now - self._pruned_at > KEEPALIVE_S:
                    self._prune(now)
            return answer

    def _prune(self, now: float) -> None:
        """Close what expired at origins no longer pushed to (a deleted subscription's)."""
        self._pruned_at = now
        for pool, connections in list(self._idle.items()):
            alive = []
            for connection in connections:
                if connection.reusable(now):
                    alive.append(connection)
                else:
                    connection.close()
            if alive:
                self._idle[pool] = alive
            else:
                del self._idle[pool]

    async def _connection(self, pool: Pool) -> Connection:
        origin, context = pool
        idle = self._idle.get(pool)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.reusable(now):
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        tls = (context or self._tls_context()) if origin.scheme == "https" else None
        # to an address the egress policy allows, the very one it checked (no second lookup)
        addresses = await self.egress.addresses(origin.host, origin.port)
        failure: OSError | None = None
        for address in addresses:
            try:
                _, connection = await loop.create_connection(
                    self._protocol if context is None else self._mutual_tls_protocol,
                    address, origin.port, ssl=tls,
                    server_hostname=origin.host.strip("[]") if tls is not None else None)
                return connection
            except OSError as exc:
                failure = exc
        assert failure is not None
        raise failure

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl
