"""`RecordingSubscriber`: a real HTTP subscriber (raw ASGI under uvicorn) that records every
push it gets and answers with a status the test chooses."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from msgbus.delivery.batch import BATCH_CONTENT_TYPE
from msgbus_cli.asgi import read_request, respond


@dataclass
class Push:
    headers: dict[str, str]
    body: bytes
    status: int = 200  # what the subscriber answered
    at: float = field(default_factory=time.monotonic)  # when it arrived

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message_id(self) -> str:
        return self.headers["ce-id"]


@dataclass
class RecordingSubscriber:
    status: int = 200
    pushes: list[Push] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (request := await read_request(scope, receive, send)) is None:
            return
        headers, body = request
        status = self.status
        with self._lock:
            self.pushes.append(Push(headers, body, status))
        await respond(send, status, b"ok")

    def message_ids(self) -> set[str]:
        with self._lock:
            return {p.message_id for p in self.pushes}

    def successes(self) -> dict[str, int]:
        """Per message, how many of its pushes were answered 2xx."""
        with self._lock:
            counts: dict[str, int] = {}
            for push in self.pushes:
                if push.succeeded:
                    counts[push.message_id] = counts.get(push.message_id, 0) + 1
            return counts


@dataclass
class CheckingSubscriber:
    """A subscriber that answers 401 to a push whose credentials `check` refuses, and records
    the others (their headers and body)."""

    check: Callable[[dict[str, str]], bool]
    accepted: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (request := await read_request(scope, receive, send)) is None:
            return
        headers, body = request
        allowed = self.check(headers)
        with self._lock:
            if allowed:
                self.accepted.append((headers, body))
            else:
                self.refused += 1
        await respond(send, 200 if allowed else 401, b"ok" if allowed else b"unauthorized")

    def message_ids(self) -> set[str]:
        with self._lock:
            return {headers["ce-id"] for headers, _ in self.accepted}


@dataclass
class ScriptedSubscriber(RecordingSubscriber):
    """Answers each push with `script(n)`, n being how many pushes of that message it has had
    (1 for the first); records the status it answered and when."""

    script: Any = None  # Callable[[int], int]
    answer_body: bytes = b"ok"  # the body of every answer
    answered: list[tuple[str, int, float]] = field(default_factory=list)
    _seen: dict[str, int] = field(default_factory=dict)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (request := await read_request(scope, receive, send)) is None:
            return
        headers, body = request
        with self._lock:
            message_id = headers["ce-id"]
            nth = self._seen[message_id] = self._seen.get(message_id, 0) + 1
            status = self.script(nth) if self.script is not None else self.status
            self.pushes.append(Push(headers, body, status))
            self.answered.append((message_id, status, time.monotonic()))
        await respond(send, status, self.answer_body)


@dataclass
class PeakSubscriber(RecordingSubscriber):
    """Answers each push after `delay_s`, and records the most pushes it ever had at once
    (`peak`) and when each push began. The first push of a message whose id `fails_first`
    picks is answered 500 (the retry then succeeds)."""

    delay_s: float = 0.1
    fails_first: Any = None  # Callable[[str], bool]
    in_flight: int = 0
    peak: int = 0
    began: list[float] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (request := await read_request(scope, receive, send)) is None:
            return
        headers, body = request
        message_id = headers["ce-id"]
        first = message_id not in self._seen
        self._seen.add(message_id)
        status = 500 if first and self.fails_first and self.fails_first(message_id) else 200
        self.in_flight += 1  # one event loop serves every push: no lock needed for these
        self.peak = max(self.peak, self.in_flight)
        self.began.append(time.monotonic())
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        with self._lock:
            self.pushes.append(Push(headers, body, status))
        await respond(send, status, b"ok")

    def busiest_second(self) -> int:
        """The most pushes that began within any one second."""
        times = sorted(self.began)
        most, start = 0, 0
        for end, at in enumerate(times):
            while at - times[start] >= 1.0:
                start += 1
            most = max(most, end - start + 1)
        return most


@dataclass
class BatchPush:
    """One batch push as a subscriber got it: its headers, raw body, events and answer."""

    headers: dict[str, str]
    body: bytes
    events: list[dict[str, Any]]
    status: int
    at: float = field(default_factory=time.monotonic)

    @property
    def batch_id(self) -> str:
        return self.headers["webhook-id"]


@dataclass
class BatchSubscriber:
    """Takes batch pushes (`application/cloudevents-batch+json`) and records each; answers
    `script(push)` (default 200), where `push` is the BatchPush before it is recorded and
    `seen` holds the message ids of every earlier push."""

    script: Any = None  # Callable[[BatchPush, set[str]], int]
    pushes: list[BatchPush] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (request := await read_request(scope, receive, send)) is None:
            return
        headers, body = request
        events = orjson.loads(body) if headers.get("content-type") == BATCH_CONTENT_TYPE else []
        with self._lock:
            push = BatchPush(headers, body, events, 200)
            push.status = self.script(push, self.seen) if self.script is not None else 200
            self.pushes.append(push)
            self.seen |= {event["id"] for event in events}
        await respond(send, push.status, b"ok")

    def delivered(self) -> dict[str, int]:
        """Per message id, how many pushes of it were answered 2xx."""
        with self._lock:
            counts: dict[str, int] = {}
            for push in self.pushes:
                if 200 <= push.status < 300:
                    for event in push.events:
                        counts[event["id"]] = counts.get(event["id"], 0) + 1
            return counts

    def all_pushes(self) -> list[BatchPush]:
        with self._lock:
            return list(self.pushes)
