"""A recording subscriber for benchmarks: raw ASGI under uvicorn, in a process of its own.

`POST /hook/<label>` records, per message number `n`, the producer's `sent_at` (from the JSON
body) and the arrival `time.time()`, and answers 200. A bus push carries the message body
`{"sent_at": ..., "n": ...}`; a direct POST carries the whole envelope `{"message_id": ...,
"body": {...}}`, which is unwrapped here, so both paths parse the same bytes.

`GET /_count/<label>?lo=A&hi=B` -> `{"unique": .., "duplicates": .., "bad": ..}` for n in [A, B);
`GET /_records/<label>?lo=A&hi=B` -> `[[n, sent_at, arrived_at], ...]` (first arrival of each n).

`serve_app(..., tls=ServerTls(...))` serves https instead (the certificate and key files; with
`client_ca_file`, client certificates that CA signed are required: mutual TLS).
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson

from msgbus_cli.asgi import answer_lifespan, read_body, respond

if TYPE_CHECKING:
    from msgbus_devtools.testkit.certs import ServerTls

HOST = "127.0.0.1"


class Recorder:
    def __init__(self) -> None:
        self.first: dict[str, dict[int, tuple[float, float]]] = {}
        self.duplicates: dict[str, dict[int, int]] = {}
        self.bad = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answer_lifespan(scope, receive, send):
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if scope["method"] == "POST" and path.startswith("/hook/"):
            body = await read_body(receive)
            self.record(path[len("/hook/"):], body, time.time())
            await respond(send, 200, b"ok")
        elif scope["method"] == "GET" and path.startswith(("/_count/", "/_records/")):
            kind, label = path[2:].split("/", 1)
            query = parse_qs(scope["query_string"].decode())
            lo, hi = int(query["lo"][0]), int(query["hi"][0])
            await respond(send, 200, orjson.dumps(self.read(kind, label, lo, hi)),
                          b"application/json")
        else:
            await respond(send, 404, b"not found")

    def record(self, label: str, body: bytes, arrived_at: float) -> None:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            self.bad += 1
            return
        # a batch push: a CloudEvents JSON batch, each event's `data` one message body
        for item in ([e["data"] for e in data] if isinstance(data, list) else [data]):
            self._record_one(label, item, arrived_at)

    def _record_one(self, label: str, data: Any, arrived_at: float) -> None:
        try:
            if "message_id" in data:
                data = data["body"]
            n, sent_at = int(data["n"]), float(data["sent_at"])
        except (KeyError, TypeError, ValueError):
            self.bad += 1
            return
        first = self.first.setdefault(label, {})
        if n in first:
            dups = self.duplicates.setdefault(label, {})
            dups[n] = dups.get(n, 0) + 1
        else:
            first[n] = (sent_at, arrived_at)

    def read(self, kind: str, label: str, lo: int, hi: int) -> Any:
        first = self.first.get(label, {})
        if kind == "records":
            return [[n, s, a] for n, (s, a) in first.items() if lo <= n < hi]
        dups = self.duplicates.get(label, {})
        return {
            "unique": sum(1 for n in first if lo <= n < hi),
            "duplicates": sum(c for n, c in dups.items() if lo <= n < hi),
            "bad": self.bad,
        }


def serve(port: int) -> None:
    """Process target: serve a `Recorder` on 127.0.0.1:`port` until SIGTERM."""
    serve_app(Recorder, port)


def serve_app(make_app: Callable[[], Any], port: int, tls: ServerTls | None = None) -> None:
    """Process target: serve `make_app()` on 127.0.0.1:`port` until SIGTERM; over https with
    `tls` (client certificates required if it names a client CA).

    SIGINT is ignored: a Ctrl-C reaches the whole process group, and the parent, which may
    still read from this process, stops it by its pid."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve(make_app(), port, tls))


async def _serve(app: Any, port: int, tls: ServerTls | None) -> None:
    from msgbus.serving import make_server

    server = make_server(app, HOST, port)  # installs no signal handlers of its own
    server.config.backlog = 4096
    if tls is not None:  # read by uvicorn's Config.load() when the server starts
        server.config.ssl_certfile = tls.cert_file
        server.config.ssl_keyfile = tls.key_file
        if tls.client_ca_file is not None:
            server.config.ssl_ca_certs = str(tls.client_ca_file)
            server.config.ssl_cert_reqs = ssl.CERT_REQUIRED

    def should_exit() -> None:
        server.should_exit = True

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, should_exit)
    await server.serve()
