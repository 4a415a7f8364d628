"""`RecordingSubscriber`: a real HTTP subscriber (raw ASGI under uvicorn) that records every
push it gets and answers with a status the test chooses."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from msgbus.asgi import answer_lifespan, read_body, request_headers, respond


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
        if await answer_lifespan(scope, receive, send):
            return
        body = await read_body(receive)
        headers = request_headers(scope)
        with self._lock:
            self.pushes.append(Push(headers, body))
        await respond(send, self.status, b"ok")

    def message_ids(self) -> set[str]:
        with self._lock:
            return {p.message_id for p in self.pushes}
