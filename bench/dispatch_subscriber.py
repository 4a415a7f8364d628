"""Subscribers of `python -m bench.dispatch`: raw ASGI under uvicorn, in a process of their own.

One app answers four kinds of subscriber, chosen by the first path segment:

- `POST /hook/<label>`: healthy. Records each message like `bench.subscriber.Recorder` (per
  body `n`: the body's `sent_at` and the arrival `time.time()`), answers 200 at once.
- `POST /hang/<label>`: never answers in time. Reads the request, then waits until the client
  gives up and disconnects (at most `HANG_MAX_S`), so a push always ends in the dispatcher's
  timeout and no request is left open for long.
- `POST /fail/<label>`: answers 500 at once.
- `POST /slow/<label>`: takes `SLOW_S` (300 ms), then records the message and answers 200.
- `POST /paced/<label>`: takes `PACED_S` (20 ms), then records the message and answers 200;
  counts the most requests of the label it had at once (`GET /_peak/<label>` -> `{"peak": n}`).

`GET /_hits/<label>` -> `{"hits": requests received}` (every kind counts its requests);
`GET /_count/<label>?lo=A&hi=B` and `GET /_records/<label>?lo=A&hi=B` as in bench.subscriber.

`serve(port, cert_file, key_file[, client_ca_file])` serves the same app over https (the auth
phase of bench.dispatch: server TLS only, and mutual TLS with the client CA).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bench.subscriber import Recorder, serve_app
from msgbus_cli.asgi import answer_lifespan, read_body, respond

HOST = "127.0.0.1"
SLOW_S = 0.3
PACED_S = 0.02
HANG_MAX_S = 30.0


class DispatchSubscriber:
    def __init__(self) -> None:
        self.recorder = Recorder()
        self.hits: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answer_lifespan(scope, receive, send):
            return
        if scope["type"] != "http":
            return
        kind, _, label = scope["path"][1:].partition("/")
        if scope["method"] == "GET":
            if kind == "_hits":
                await respond(send, 200, orjson.dumps({"hits": self.hits[label]}),
                              b"application/json")
            elif kind == "_peak":
                await respond(send, 200, orjson.dumps({"peak": self.peak[label]}),
                              b"application/json")
            else:
                await self.recorder(scope, receive, send)  # _count, _records, 404
            return
        self.hits[label] += 1
        if kind == "hook":
            self.recorder.record(label, await read_body(receive), time.time())
            await respond(send, 200, b"ok")
        elif kind == "fail":
            await read_body(receive)
            await respond(send, 500, b"failing on purpose")
        elif kind == "slow":
            body = await read_body(receive)
            await asyncio.sleep(SLOW_S)
            self.recorder.record(label, body, time.time())
            await respond(send, 200, b"ok")
        elif kind == "paced":
            await self._paced(label, receive, send)
        elif kind == "hang":
            await read_body(receive)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_disconnected(receive), HANG_MAX_S)
            with contextlib.suppress(Exception):  # the client is usually gone by now
                await respond(send, 504, b"too late")
        else:
            await respond(send, 404, b"not found")


    async def _paced(self, label: str, receive: Any, send: Any) -> None:
        body = await read_body(receive)
        self.in_flight[label] += 1
        self.peak[label] = max(self.peak[label], self.in_flight[label])
        try:
            await asyncio.sleep(PACED_S)
        finally:
            self.in_flight[label] -= 1
        self.recorder.record(label, body, time.time())
        await respond(send, 200, b"ok")


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def serve(port: int, cert_file: str | None = None, key_file: str | None = None,
          client_ca_file: str | None = None) -> None:
    """Process target: serve a `DispatchSubscriber` on 127.0.0.1:`port` until SIGTERM; over
    https with a certificate and key (files), requiring client certificates signed by the CA of
    `client_ca_file` if given (mutual TLS)."""
    tls = None
    if cert_file is not None and key_file is not None:
        from msgbus_devtools.testkit.certs import ServerTls

        tls = ServerTls(Path(cert_file), Path(key_file),
                        Path(client_ca_file) if client_ca_file is not None else None)
    serve_app(DispatchSubscriber, port, tls)
