"""Per-message outcomes of one `publish` call, filled in by a broker client's own thread.

The client thread calls `resolve(index, error)` as acknowledgements arrive; when the last one
is in, the batch's asyncio future completes through `call_soon_threadsafe`. `seal` ends the
wait: anything unresolved gets the given error, later reports are ignored.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from msgbus.brokers.base import PublishOutcome
from msgbus.models import Envelope


class PublishBatch:
    def __init__(self, loop: asyncio.AbstractEventLoop, envelopes: Sequence[Envelope]) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self.envelopes = envelopes
        self._errors: list[str | None] = [None] * len(envelopes)
        self._resolved = [False] * len(envelopes)
        self._remaining = len(envelopes)
        self._sealed = False
        self.done: asyncio.Future[None] = loop.create_future()
        if not envelopes:
            self.done.set_result(None)

    @property
    def sealed(self) -> bool:
        return self._sealed

    def resolve(self, index: int, error: str | None) -> None:
        """Record the outcome of message `index` (any thread; the first report wins)."""
        with self._lock:
            if self._sealed or self._resolved[index]:
                return
            self._resolved[index] = True
            self._errors[index] = error
            self._remaining -= 1
            finished = self._remaining == 0
        if finished:
            self._loop.call_soon_threadsafe(self._finish)

    @property
    def complete(self) -> bool:
        """Every message has an outcome, or the batch is sealed."""
        with self._lock:
            return self._sealed or self._remaining == 0

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def seal(self, reason: str) -> list[PublishOutcome]:
        """Stop waiting (any thread): unresolved messages get `reason`, later reports are
        ignored and `done` completes. Returns one outcome per message."""
        with self._lock:
            self._sealed = True
            for i, resolved in enumerate(self._resolved):
                if not resolved:
                    self._resolved[i] = True
                    self._errors[i] = reason
            errors = list(self._errors)
        self._loop.call_soon_threadsafe(self._finish)
        return [
            PublishOutcome(envelope.message_id, error)
            for envelope, error in zip(self.envelopes, errors, strict=True)
        ]
