"""`ClientLoad`: a bounded, steady stream of messages sent with the real producer library
(`MsgbusClient`, LMDB spool), recording every message whose `send()` returned.

That is the bus's promise to an application: once `send()` returned, the message reaches every
subscriber, through receiver kills (the client's resender sends it again) and whatever happens
behind the receiver. Message k is due at start + k / rate and goes to destination
k mod len(destinations); `senders` threads share one client, so a `send()` held up by its
inline POST (a receiver that stalls) does not stall the stream. It stops by itself after
`duration_s`, or at `stop()`; `close()` then flushes the client's spool (up to its timeout).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from msgbus_client import MsgbusClient


@dataclass(frozen=True, slots=True)
class Sent:
    """One send() that returned: the message is durable in the spool."""

    number: int
    message_id: str
    destination: str
    returned_after_s: float  # how long send() took


class ClientLoad:
    def __init__(
        self, receiver_url: str, api_key: str, spool_dir: Path, destinations: Sequence[str], *,
        rate_per_s: float, duration_s: float, senders: int = 8, biz_keys: int = 64,
    ) -> None:
        if not destinations:
            raise ValueError("at least one destination")
        self.destinations = list(destinations)
        self.rate_per_s = rate_per_s
        self.duration_s = duration_s
        # quick re-sends after a receiver comes back; a short timeout so that a send() whose
        # POST hangs on a dying receiver soon leaves the message to the resender
        self.client = MsgbusClient(
            receiver_url, api_key, spool_dir=spool_dir, max_inline_requests=senders,
            request_timeout_s=5.0, connect_timeout_s=2.0, retry_base_s=0.2, retry_max_s=2.0,
            idle_poll_s=1.0)
        self._biz_keys = biz_keys
        self._sent: list[Sent] = []
        self._errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sender, name=f"client-load-{i}",
                                          daemon=True) for i in range(senders)]
        self.started_at = 0.0
        self.ended_at: float | None = None

    # -- control -------------------------------------------------------------------------

    def start(self) -> ClientLoad:
        self.started_at = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def end_after(self, duration_s: float) -> None:
        """Send until `duration_s` after the start instead (a sender that already stopped
        stays stopped: shorten, or lengthen while the load still runs)."""
        self.duration_s = duration_s

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float = 60) -> None:
        """Wait until every sender returned from its last send()."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise AssertionError(f"a send() did not return within {timeout_s:.0f} s")
        self.ended_at = time.monotonic()

    def spooled(self) -> int:
        """Messages still in the client's spool (not yet accepted by a receiver)."""
        return self.client.spool.pending_count()

    def close(self, timeout_s: float = 10) -> int:
        """Closes the client; returns how many messages stayed in its spool."""
        return self.client.close(timeout_s)

    # -- results -------------------------------------------------------------------------

    def sent(self) -> list[Sent]:
        with self._lock:
            return list(self._sent)

    def sent_ids(self, destination: str | None = None) -> set[str]:
        return {s.message_id for s in self.sent() if destination in (None, s.destination)}

    def errors(self) -> Counter[str]:
        with self._lock:
            return Counter(self._errors)

    def elapsed_s(self) -> float:
        return (self.ended_at or time.monotonic()) - self.started_at

    def summary(self) -> str:
        sent = self.sent()
        slowest = max((s.returned_after_s for s in sent), default=0.0)
        errors = self.errors()
        return (f"{len(sent)} send()s returned in {self.elapsed_s():.1f} s "
                f"({len(sent) / max(self.elapsed_s(), 1e-9):.0f}/s, slowest "
                f"{slowest * 1000:.0f} ms), {self.spooled()} in the spool"
                + (f", errors: {dict(errors)}" if errors else ""))

    # -- the senders (threads) -------------------------------------------------------------

    def _take_number(self) -> int | None:
        with self._lock:
            number = self._next
            self._next += 1
        if self._stop.is_set() or number / self.rate_per_s >= self.duration_s:
            return None
        return number

    def _sender(self) -> None:
        while (number := self._take_number()) is not None:
            due = self.started_at + number / self.rate_per_s
            if (delay := due - time.monotonic()) > 0:
                time.sleep(delay)
            if self._stop.is_set():
                return
            destination = self.destinations[number % len(self.destinations)]
            began = time.monotonic()
            try:
                message_id = self.client.send(
                    destination, {"n": number, "sent_at": time.time()},
                    biz_id=f"chaos-{number % self._biz_keys}")
            except Exception as exc:  # recorded and reported: such a message is not promised
                with self._lock:
                    self._errors[type(exc).__name__] += 1
                continue
            sent = Sent(number, message_id, destination, time.monotonic() - began)
            with self._lock:
                self._sent.append(sent)
