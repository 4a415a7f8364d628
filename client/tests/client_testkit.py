"""Test kit for the client tests: a real, tiny HTTP receiver (stdlib http.server in a thread)
and polling helpers.

It speaks the producer side of docs/protocol.md, records what it accepted, and can be told to
answer busy (503/429 + Retry-After), reject chosen messages, or be down (stopped; it can start
again on the same port).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "test-api-key"

# (destination, message document) -> None to accept, or (status, error JSON) to refuse
Rule = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]] | None]


@dataclass(frozen=True)
class Received:
    destination: str
    doc: dict[str, Any]  # the message as sent (batch items without "destination")
    endpoint: str  # "single" | "batch"
    authorization: str


@dataclass(frozen=True)
class Attempt:
    endpoint: str
    status: int
    count: int  # messages in the request
    at: float  # time.monotonic()


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    received: list[Received] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    busy: tuple[int, str | None] | None = None
    rule: Rule | None = None
    schemas: dict[str, tuple[int, Any]] = field(default_factory=dict)  # code -> version, schema
    schema_gets: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # listen backlog; the default 5 drops SYNs under concurrent connects

    def __init__(self, port: int, state: _State) -> None:
        self.state = state
        self.open_conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conns_lock:
            self.open_conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.conns_lock:
            self.open_conns.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self.conns_lock:
            conns = list(self.open_conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without this, Nagle + delayed ACK add 40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _answer(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """`GET /v1/destinations/{code}/schema`, as the receiver answers it."""
        state = self.server.state
        parts = self.path.strip("/").split("/")
        with state.lock:
            state.schema_gets += 1
            found = state.schemas.get(parts[2]) if len(parts) == 4 else None
        if found is None or parts[3] != "schema":
            self._answer(404, {"error": "not_found", "message": "no payload schema"})
            return
        version, schema = found
        self._answer(200, {"destination": parts[2], "version": version, "schema": schema,
                           "compatibility": "backward"})

    def do_POST(self) -> None:
        state = self.server.state
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        parts = self.path.strip("/").split("/")
        if parts == ["v1", "messages"]:
            endpoint = "batch"
        elif len(parts) == 4 and parts[:2] == ["v1", "destinations"] and parts[3] == "messages":
            endpoint = "single"
        else:
            self._answer(404, {"error": "not_found", "message": self.path})
            return
        auth = self.headers.get("Authorization", "")
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        count = len(doc.get("messages", [])) if endpoint == "batch" and doc else 1
        with state.lock:
            busy, rule = state.busy, state.rule
        status, answer, extra = self._decide(endpoint, parts, doc, auth, busy, rule)
        with state.lock:
            state.attempts.append(Attempt(endpoint, status, count, time.monotonic()))
        self._answer(status, answer, extra)

    def _decide(
        self,
        endpoint: str,
        parts: list[str],
        doc: Any,
        auth: str,
        busy: tuple[int, str | None] | None,
        rule: Rule | None,
    ) -> tuple[int, Any, dict[str, str]]:
        if auth != f"Bearer {API_KEY}":
            return 401, {"error": "unauthorized", "message": "bad API key"}, {}
        if busy is not None:
            status, retry_after = busy
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return status, {"error": "busy", "message": "try later"}, headers
        if not isinstance(doc, dict):
            return 400, {"error": "malformed", "message": "not JSON"}, {}
        if endpoint == "single":
            status, answer = self._one(parts[2], doc, "single", auth, rule)
            return status, answer, {}
        results = []
        for item in doc.get("messages", []):
            item = dict(item)
            destination = item.pop("destination")
            status, answer = self._one(destination, item, "batch", auth, rule)
            error = None if status == 202 else answer
            results.append({"message_id": item.get("message_id"), "status": status, "error": error})
        return 200, {"results": results}, {}

    def _one(
        self, destination: str, doc: dict[str, Any], endpoint: str, auth: str, rule: Rule | None
    ) -> tuple[int, dict[str, Any]]:
        refused = rule(destination, doc) if rule is not None else None
        if refused is not None:
            return refused
        state = self.server.state
        with state.lock:
            message_id = doc["message_id"]
            duplicate = message_id in state.seen
            state.seen.add(message_id)
            if not duplicate:
                state.received.append(Received(destination, doc, endpoint, auth))
        return 202, {"message_id": message_id, "status": "duplicate" if duplicate else "accepted"}


class StubReceiver:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._state = _State()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- control --------------------------------------------------------------------------------

    def start(self) -> StubReceiver:
        self._server = _Server(self.port, self._state)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Down: stop listening and cut every open (keep-alive) connection."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server.drop_connections()
        assert self._thread is not None
        self._thread.join(5)
        self._server = None

    def reset(self) -> None:
        with self._state.lock:
            self._state.received.clear()
            self._state.attempts.clear()
            self._state.seen.clear()
            self._state.busy = None
            self._state.rule = None
            self._state.schemas.clear()
            self._state.schema_gets = 0

    def set_busy(self, status: int = 503, retry_after: str | None = None) -> None:
        with self._state.lock:
            self._state.busy = (status, retry_after)

    def set_ready(self) -> None:
        with self._state.lock:
            self._state.busy = None

    def set_schema(self, destination: str, version: int, schema: Any) -> None:
        with self._state.lock:
            self._state.schemas[destination] = (version, schema)

    @property
    def schema_gets(self) -> int:
        with self._state.lock:
            return self._state.schema_gets

    def set_rule(self, rule: Rule | None) -> None:
        with self._state.lock:
            self._state.rule = rule

    # -- observations ---------------------------------------------------------------------------

    @property
    def received(self) -> list[Received]:
        with self._state.lock:
            return list(self._state.received)

    @property
    def attempts(self) -> list[Attempt]:
        with self._state.lock:
            return list(self._state.attempts)

    def ids(self) -> list[str]:
        return [r.doc["message_id"] for r in self.received]


# The repo's test kit has the one polling helper (msgbus_devtools.testkit.waiting): these two are
# a copy of it with the same names and argument order, because the client's tests run with the
# client package alone (`cd client && pytest`, deps in client/pyproject.toml's [test]).


class NotInTime(AssertionError):
    """The awaited condition did not hold within its time budget."""


def _polls(condition: Callable[[], Any], timeout_s: float, what: str | None,
           interval_s: float) -> Iterator[float]:
    """The pauses between checks of `condition` until it holds; `NotInTime` after
    `timeout_s`, naming `what` (or the condition's source line). The sync and async forms
    below only sleep them."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            if what is None:
                with contextlib.suppress(OSError, TypeError):
                    what = inspect.getsource(condition).strip()
            raise NotInTime(f"timed out after {timeout_s:g} s waiting for {what or condition}")
        yield interval_s


def eventually(condition: Callable[[], Any], timeout_s: float = 10.0, what: str | None = None,
               *, interval_s: float = 0.01) -> None:
    """Poll `condition` until it holds; `NotInTime` after `timeout_s`."""
    for pause in _polls(condition, timeout_s, what, interval_s):
        time.sleep(pause)


async def eventually_async(condition: Callable[[], Any], timeout_s: float = 10.0,
                           what: str | None = None, *, interval_s: float = 0.01) -> None:
    """`eventually` for tests on the event loop."""
    for pause in _polls(condition, timeout_s, what, interval_s):
        await asyncio.sleep(pause)


# Short intervals so the tests run fast.
FAST: dict[str, Any] = {
    "retry_base_s": 0.05,
    "retry_max_s": 0.3,
    "idle_poll_s": 0.2,
    "request_timeout_s": 2.0,
    "connect_timeout_s": 1.0,
}
