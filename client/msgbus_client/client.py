"""`MsgbusClient`: the blocking producer client.

send() contract: it returns the message id once the message is durable in the local spool
(fsync'd). A network or receiver failure never makes send() raise once the message is spooled:
the message stays for the resender.

* One commit per send() (`group_commit_ms=0`): after the commit send() makes one inline attempt
  to POST the message, unless older messages wait in the spool (they go first, in order), the
  receiver is failing (backoff), or `max_inline_requests` POSTs are running. With
  `inline_send=False` send() returns right after the commit.
* Group commit (`group_commit_ms > 0`): concurrent send()s share one commit (see groupcommit)
  and return right after it; the resender delivers, in batches.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Self, Unpack

import httpx

from msgbus_client import metrics
from msgbus_client.base import DEFAULT_CLOSE_TIMEOUT_S, BaseClient, time_left
from msgbus_client.delivery import Deliverer
from msgbus_client.groupcommit import GroupCommitter, GroupResult
from msgbus_client.message import Entry, MessageOptions, build_entry
from msgbus_client.resender import Resender
from msgbus_client.schemas import DestinationSchema, checked
from msgbus_client.spool import RejectedMessage
from msgbus_client.transport import HttpSender


class MsgbusClient(BaseClient[httpx.BaseTransport, Deliverer]):
    """Blocking producer client; thread-safe. Options as described on `BaseClient`."""

    _resender: Resender

    def _connect(self, api_key: str, transport: httpx.BaseTransport | None) -> Deliverer:
        sender = HttpSender(self.settings, api_key, transport=transport)
        return Deliverer(self.spool, sender, self._health, self.counters)

    def _set_up(self) -> None:
        s = self.settings
        self._inline_slots = threading.BoundedSemaphore(s.max_inline_requests)
        self._cond = threading.Condition()
        self._committer: GroupCommitter | None = None
        if s.group_commit:
            window_s = s.group_commit_ms / 1000
            self._committer = GroupCommitter(
                self._commit_group, window_s=window_s, max_group=s.max_group_messages
            )
        self._resender = Resender(self._resend_plan(), self._deliverer)
        self.spool.add_listener(self._resender.wake)
        self._resender.start()

    # -- public API -----------------------------------------------------------------------------

    def send(self, destination: str, message: object, **options: Unpack[MessageOptions]) -> str:
        """Spool `message` durably and return its message id (see the module docstring).
        Keywords: `biz_id`, `headers`, `content_type`, `traceparent`, `tracestate`,
        `deliver_at` or `delay_s` (delayed delivery) (see `build_entry`).

        Raises InvalidMessageError (a TypeError and ValueError) for input it cannot encode,
        SchemaValidationError (one of those) with validate=True for a message its
        destination's schema refuses, SpoolFullError when max_spool_bytes is reached,
        SpoolDiskFullError when the disk is full, ClientClosedError after close(). Never raises
        for network or receiver failures once the message is spooled.
        """
        try:
            schema = self._schema_of(destination)
            if self._committer is not None:  # counts SENT per group, see _commit_group
                entry = self._committer.commit(
                    lambda: checked(build_entry(destination, message, **options), schema))
            else:
                entry = checked(build_entry(destination, message, **options), schema)
                self._send_one(entry)
        except BaseException as exc:
            self.counters.send_error(exc)
            raise
        return entry.message_id

    def close(self, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> int:
        """Stop sending: flush the spool for up to `timeout_s`, then close it.

        Returns how many messages stay pending in the spool (a later client on the same
        spool_dir sends them). Idempotent.
        """
        with self._cond:
            if self._closed:
                return 0
            self._closed = True
            deadline = time.monotonic() + timeout_s
            limit = timeout_s + self.settings.request_timeout_s
            self._cond.wait_for(lambda: self._active_sends == 0, limit)
        if self._committer is not None:
            self._committer.close(self.settings.request_timeout_s + 1)
        self._resender.stop(time_left(deadline))
        left = self.spool.pending_count()
        self._deliverer.sender.close()
        self.spool.close()
        return self._closed_with(left)

    def list_rejected(self, limit: int | None = None) -> list[RejectedMessage]:
        return self.spool.list_rejected(limit)

    def resend_rejected(self, message_id: str) -> bool:
        return self.spool.resend_rejected(message_id)

    def purge_rejected(self, message_id: str | None = None) -> int:
        return self.spool.purge_rejected(message_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------

    def _schema_of(self, destination: object) -> DestinationSchema | None:
        due, held = self._schema_due(destination)
        if due and self._schemas is not None and isinstance(destination, str):
            answer = self._deliverer.sender.get(self._schemas.path(destination))
            held = self._schemas.remember(destination, answer)
        return held

    def _commit_group(self, entries: list[Entry]) -> GroupResult:
        """Run by a group's leader: one commit for all; the resender delivers them."""
        refused = self.spool.append(entries)
        self.counters.add(metrics.SENT, len(entries) - len(refused))
        return self._committed(entries, refused)

    def _send_one(self, entry: Entry) -> None:
        with self._cond:
            self._refuse_if_closed()
            self._active_sends += 1
        try:
            self._spool_and_deliver(entry)
        finally:
            with self._cond:
                self._active_sends -= 1
                self._cond.notify_all()
        self.counters.add(metrics.SENT)

    def _spool_and_deliver(self, entry: Entry) -> None:
        """One commit, then the inline attempt if it may go; only the commit can raise."""
        if not (self._inline_allowed() and self._inline_slots.acquire(blocking=False)):
            self.spool.put(entry)
            self._leave_to_resender()
            return
        try:
            with self._in_flight.holding(entry.key):  # the resender skips it meanwhile
                self.spool.put(entry)
                delivered = self._deliver_inline(entry)
        finally:
            self._inline_slots.release()
        if not delivered:
            self._leave_to_resender()

    def _deliver_inline(self, entry: Entry) -> bool:
        try:
            return not self._deliverer.deliver([entry]).retry
        except Exception:
            return self._inline_failed()
