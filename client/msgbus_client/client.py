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

import logging
import threading
import time
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from msgbus_client import metrics
from msgbus_client.delivery import (
    Backlog,
    Deliverer,
    InFlight,
    group_results,
    inline_allowed,
    open_spool_and_sender,
)
from msgbus_client.errors import ClientClosedError
from msgbus_client.groupcommit import GroupCommitter, GroupResult
from msgbus_client.message import Entry, build_entry
from msgbus_client.metrics import ClientCounters, ClientMetrics
from msgbus_client.resender import Resender, ResendPlan
from msgbus_client.settings import ClientSettings
from msgbus_client.spool import DEFAULT_MAX_SPOOL_BYTES, RejectedMessage
from msgbus_client.transport import HttpSender

log = logging.getLogger("msgbus_client")

DEFAULT_CLOSE_TIMEOUT_S = 10.0


class MsgbusClient:
    """Blocking producer client; thread-safe.

    Give it `spool_dir`, a dir this process owns (a second owner gets SpoolLockedError), or
    `spool_root`, shared by several processes: each takes the first free `slot-N` below it.
    """

    def __init__(
        self,
        receiver_url: str,
        api_key: str,
        *,
        spool_dir: str | PathLike[str] | None = None,
        spool_root: str | PathLike[str] | None = None,
        max_slots: int = 64,
        group_commit_ms: float = 0.0,
        max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
        inline_send: bool = True,
        max_inline_requests: int = 32,
        request_timeout_s: float = 10.0,
        connect_timeout_s: float = 3.0,
        retry_base_s: float = 0.5,
        retry_max_s: float = 30.0,
        max_batch_messages: int = 100,
        max_batch_bytes: int = 1_000_000,
        idle_poll_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = ClientSettings(
            receiver_url=receiver_url,
            spool_dir=None if spool_dir is None else Path(spool_dir),
            spool_root=None if spool_root is None else Path(spool_root),
            max_slots=max_slots,
            group_commit_ms=group_commit_ms,
            max_spool_bytes=max_spool_bytes,
            inline_send=inline_send,
            max_inline_requests=max_inline_requests,
            request_timeout_s=request_timeout_s,
            connect_timeout_s=connect_timeout_s,
            retry_base_s=retry_base_s,
            retry_max_s=retry_max_s,
            max_batch_messages=max_batch_messages,
            max_batch_bytes=max_batch_bytes,
            idle_poll_s=idle_poll_s,
        )
        self.spool, self._sender, self._health = open_spool_and_sender(
            self.settings,
            api_key,
            lambda: HttpSender(self.settings, api_key, transport=transport),
        )
        s = self.settings
        self.counters = ClientCounters()
        self._in_flight = InFlight()
        self._backlog = Backlog(present=self.spool.pending_count() > 0)
        self._inline_slots = threading.BoundedSemaphore(s.max_inline_requests)
        self._deliverer = Deliverer(self.spool, self._sender, self._health, self.counters)
        self._cond = threading.Condition()
        self._active_sends = 0
        self._closed = False
        self._committer: GroupCommitter | None = None
        if s.group_commit:
            self._committer = GroupCommitter(
                self._commit_group,
                window_s=s.group_commit_ms / 1000,
                max_group=s.max_group_messages,
            )
        plan = ResendPlan(s, self._health, self._backlog, self.spool, self._in_flight)
        self._resender = Resender(plan, self._deliverer)
        self.spool.add_listener(self._resender.wake)
        self._resender.start()

    # -- public API -----------------------------------------------------------------------------

    def send(
        self,
        destination: str,
        message: object,
        *,
        biz_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Spool `message` durably and return its message id (see the module docstring).

        Raises InvalidMessageError (a TypeError and ValueError) for input it cannot encode,
        SpoolFullError when max_spool_bytes is reached, SpoolDiskFullError when the disk is
        full, ClientClosedError after close(). Never raises for network or receiver failures
        once the message is spooled.
        """
        try:
            if self._committer is not None:
                entry = self._committer.commit(  # counts SENT per group, see _commit_group
                    lambda: build_entry(
                        destination, message, biz_id=biz_id, headers=headers,
                        content_type=content_type,
                    )
                )
            else:
                entry = build_entry(
                    destination, message, biz_id=biz_id, headers=headers,
                    content_type=content_type,
                )
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
        self._resender.stop(max(0.0, deadline - time.monotonic()))
        left = self.spool.pending_count()
        self._sender.close()
        self.spool.close()
        if left:
            log.warning(
                "msgbus_client: closed with %d message(s) left in spool %s; a client on the same "
                "spool_dir will send them",
                left,
                self.spool.path,
            )
        return left

    def list_rejected(self, limit: int | None = None) -> list[RejectedMessage]:
        return self.spool.list_rejected(limit)

    def resend_rejected(self, message_id: str) -> bool:
        return self.spool.resend_rejected(message_id)

    def purge_rejected(self, message_id: str | None = None) -> int:
        return self.spool.purge_rejected(message_id)

    def metrics(self) -> ClientMetrics:
        """Spool depth, oldest message age, counters (see msgbus_client.metrics)."""
        return metrics.snapshot(
            self.spool, self.counters, backing_off=self._health.backing_off()
        )

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

    def _commit_group(self, entries: list[Entry]) -> GroupResult:
        """Run by a group's leader: one commit for all; the resender delivers them."""
        refused = self.spool.append(entries)
        if len(refused) < len(entries):
            self.counters.add(metrics.SENT, len(entries) - len(refused))
            self._resender.wake()
        return group_results(self.spool, entries, refused)

    def _send_one(self, entry: Entry) -> None:
        with self._cond:
            if self._closed:
                raise ClientClosedError("the client is closed")
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
        inline = inline_allowed(
            self.settings, self._backlog, self._health
        ) and self._inline_slots.acquire(blocking=False)
        if not inline:
            self.spool.put(entry)
            self._leave_to_resender()
            return
        delivered = False
        self._in_flight.add(entry.key)  # only while this thread delivers it: the resender skips it
        try:
            self.spool.put(entry)
            try:
                delivered = not self._deliverer.deliver([entry]).retry
            except Exception:
                log.exception("msgbus_client: inline delivery failed; the resender will retry")
        finally:
            self._in_flight.discard([entry.key])
            self._inline_slots.release()
        if not delivered:
            self._leave_to_resender()

    def _leave_to_resender(self) -> None:
        self._backlog.mark()
        self._resender.wake()
