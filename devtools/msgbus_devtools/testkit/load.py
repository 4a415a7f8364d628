"""`SteadyLoad`: a bounded, steady stream of messages to one or more receivers, recording the
answer to every request, so that a test knows exactly which message ids were accepted (202).

It runs its own asyncio loop on a background thread with several aiohttp clients. Message k is
due at start + k / rate; it goes to receiver k mod len(receivers) and destination
k mod len(destinations). Up to `in_flight` requests are outstanding at once, so a stalled
receiver slows the stream down instead of piling up requests. It stops by itself once
`duration_s` has passed (and the requests still in flight are answered or time out), or at
`stop()`. Given `messages` instead, it sends exactly that many at `rate_per_s`, however long a
busy machine makes that take: a test that asserts on counts should not depend on the pace.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from msgbus.ids import uuid7


@dataclass(frozen=True, slots=True)
class Answer:
    """One request: `status` None means no HTTP answer (connection refused, reset, timeout)."""

    number: int
    message_id: str
    destination: str
    receiver: str
    status: int | None
    error: str | None
    sent_at: float  # time.monotonic()
    answered_at: float

    @property
    def accepted(self) -> bool:
        return self.status == 202


class SteadyLoad:
    def __init__(
        self, receivers: Sequence[str], destinations: Sequence[str], api_key: str, *,
        rate_per_s: float, duration_s: float | None = None, messages: int | None = None,
        clients: int = 4, in_flight: int = 32, request_timeout_s: float = 30.0,
        biz_keys: int = 64,
    ) -> None:
        if not receivers or not destinations:
            raise ValueError("at least one receiver and one destination")
        if (duration_s is None) == (messages is None):
            raise ValueError("give either duration_s or messages")
        self.receivers = list(receivers)
        self.destinations = list(destinations)
        self.rate_per_s = rate_per_s
        self.messages = messages
        self.duration_s = messages / rate_per_s if messages is not None else float(duration_s or 0)
        self._api_key = api_key
        self._clients = clients
        self._in_flight = in_flight
        self._timeout_s = request_timeout_s
        self._biz_keys = biz_keys
        self._answers: list[Answer] = []
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="steady-load", daemon=True)
        self.started_at = 0.0
        self.finished_at: float | None = None

    # -- control (test thread) ---------------------------------------------------------

    def start(self) -> SteadyLoad:
        self.started_at = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Send no more messages (requests in flight still finish)."""
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the load to end by itself (its duration plus the request timeout)."""
        expected_s = self.duration_s if self.messages is None else 3 * self.duration_s
        limit = timeout_s if timeout_s is not None else expected_s + self._timeout_s + 30
        self._thread.join(limit)
        if self._thread.is_alive():
            raise AssertionError(f"the load did not end within {limit:.0f} s")

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    def elapsed_s(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started_at

    # -- results -----------------------------------------------------------------------

    def answers(self) -> list[Answer]:
        with self._lock:
            return list(self._answers)

    def accepted_ids(self, destination: str | None = None) -> set[str]:
        return {a.message_id for a in self.answers()
                if a.accepted and destination in (None, a.destination)}

    def answered_within(self, start: float, end: float) -> list[Answer]:
        """Requests sent at or after `start` and answered by `end` (monotonic times)."""
        return [a for a in self.answers() if a.sent_at >= start and a.answered_at <= end]

    def statuses(self, answers: Sequence[Answer] | None = None) -> Counter[str]:
        chosen = self.answers() if answers is None else answers
        return Counter(str(a.status) if a.status is not None else "no-answer" for a in chosen)

    def summary(self) -> str:
        answers = self.answers()
        rate = len(answers) / max(self.elapsed_s(), 1e-9)
        return (f"{len(answers)} requests in {self.elapsed_s():.1f} s ({rate:.0f}/s), "
                f"by answer: {dict(sorted(self.statuses(answers).items()))}")

    # -- the load (its own thread and loop) --------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        finally:
            self.finished_at = time.monotonic()

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        headers = {"authorization": f"Bearer {self._api_key}",
                   "content-type": "application/json"}
        sessions = [aiohttp.ClientSession(timeout=timeout, headers=headers)
                    for _ in range(self._clients)]
        try:
            await asyncio.gather(*(self._worker(sessions[i % len(sessions)])
                                   for i in range(self._in_flight)))
        finally:
            for session in sessions:
                await session.close()

    def _take_number(self) -> int | None:
        """The next message number, or None when the load is over."""
        with self._lock:
            number = self._next
            self._next += 1
        if self._stop.is_set():
            return None
        if self.messages is not None:
            return number if number < self.messages else None
        return number if number / self.rate_per_s < self.duration_s else None

    def _past_duration(self) -> bool:
        return (self.messages is None
                and time.monotonic() - self.started_at >= self.duration_s)

    async def _worker(self, session: aiohttp.ClientSession) -> None:
        while (number := self._take_number()) is not None:
            delay = self.started_at + number / self.rate_per_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if self._stop.is_set() or self._past_duration():
                return
            await self._send(session, number)

    async def _send(self, session: aiohttp.ClientSession, number: int) -> None:
        receiver = self.receivers[number % len(self.receivers)]
        destination = self.destinations[number % len(self.destinations)]
        message_id = uuid7()
        body = orjson.dumps({"message_id": message_id,
                             "biz_id": f"load-{number % self._biz_keys}",
                             "body": {"n": number}})
        url = f"{receiver}/v1/destinations/{destination}/messages"
        sent_at = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            async with session.post(url, data=body) as response:
                status = response.status
                if status != 202:
                    error = (await response.text())[:300]
                else:
                    await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        answer = Answer(number, message_id, destination, receiver, status, error, sent_at,
                        time.monotonic())
        with self._lock:
            self._answers.append(answer)
