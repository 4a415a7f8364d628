"""`RecordingSubscriber`: a real HTTP subscriber (raw ASGI under uvicorn) that records every
push it gets and answers with a status the test chooses."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Push:
    headers: dict[str, str]
    body: bytes

    @property
    def message_id(self) -> str:
        return self.headers["ce-id"]


@dataclass
class RecordingSubscriber:
    status: int = 200
    pushes: list[Push] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        with self._lock:
            self.pushes.append(Push(headers, body))
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": b"ok"})

    def message_ids(self) -> set[str]:
        with self._lock:
            return {p.message_id for p in self.pushes}
