"""`AsyncMsgbusClient`: the asyncio producer client, same contract as `MsgbusClient`.

Spool work (LMDB, fsync) runs in worker threads (`asyncio.to_thread`) so the event loop never
blocks on the disk; HTTP goes through httpx.AsyncClient. The resender is a task, started by
`start()`, `async with`, or the first send(); use one client from one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from msgbus_client import metrics
from msgbus_client.delivery import (
    AsyncDeliverer,
    Backlog,
    InFlight,
    group_results,
    inline_allowed,
    open_spool_and_sender,
)
from msgbus_client.errors import ClientClosedError
from msgbus_client.groupcommit import AsyncGroupCommitter, GroupResult
from msgbus_client.message import Entry, build_entry
from msgbus_client.metrics import ClientCounters, ClientMetrics
from msgbus_client.resender import AsyncResender, ResendPlan
from msgbus_client.settings import ClientSettings
from msgbus_client.spool import DEFAULT_MAX_SPOOL_BYTES, RejectedMessage
from msgbus_client.transport import AsyncHttpSender

log = logging.getLogger("msgbus_client")

DEFAULT_CLOSE_TIMEOUT_S = 10.0


class AsyncMsgbusClient:
    """asyncio producer client; `spool_dir` / `spool_root` as for MsgbusClient."""

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
        transport: httpx.AsyncBaseTransport | None = None,
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
            lambda: AsyncHttpSender(self.settings, api_key, transport=transport),
        )
        s = self.settings
        self.counters = ClientCounters()
        self._in_flight = InFlight()
        self._backlog = Backlog(present=self.spool.pending_count() > 0)
        self._inline_slots = asyncio.Semaphore(s.max_inline_requests)
        self._deliverer = AsyncDeliverer(self.spool, self._sender, self._health, self.counters)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resender: AsyncResender | None = None
        self._committer: AsyncGroupCommitter | None = None
        self._active_sends = 0
        self._idle: asyncio.Event | None = None
        self._closed = False

    # -- public API -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the resender (idempotent). It picks up what an earlier process left behind."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not None:
            if self._loop is not loop:
                raise RuntimeError("an AsyncMsgbusClient must be used from one event loop")
            return
        self._loop = loop
        self._idle = asyncio.Event()
        self._idle.set()
        s = self.settings
        self._resender = AsyncResender(self._resend_plan(), self._deliverer)
        self.spool.add_listener(self._resender.wake)
        if s.group_commit:
            self._committer = AsyncGroupCommitter(
                self._commit_group, max_group=s.max_group_messages
            )

    async def send(
        self,
        destination: str,
        message: object,
        *,
        biz_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Spool `message` durably and return its message id.

        Same contract and errors as MsgbusClient.send(). With group commit, concurrent send()s
        share a commit that starts as soon as the previous one ends.
        """
        try:
            entry = build_entry(
                destination, message, biz_id=biz_id, headers=headers, content_type=content_type
            )
            await self.start()
            assert self._idle is not None
            self._active_sends += 1
            self._idle.clear()
            try:
                if self._committer is not None:
                    await self._committer.submit(entry)
                else:
                    await self._spool_and_deliver(entry)
            finally:
                self._active_sends -= 1
                if self._active_sends == 0:
                    self._idle.set()
        except BaseException as exc:
            self.counters.send_error(exc)
            raise
        self.counters.add(metrics.SENT)
        return entry.message_id

    async def close(self, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> int:
        """Flush the spool for up to `timeout_s`, then close it; return how many messages stay
        pending (a later client on the same spool_dir sends them). Idempotent."""
        if self._closed:
            return 0
        self._closed = True
        deadline = time.monotonic() + timeout_s
        if self._idle is not None:
            try:
                await asyncio.wait_for(
                    self._idle.wait(), timeout_s + self.settings.request_timeout_s
                )
            except TimeoutError:
                log.warning("msgbus_client: close() gave up waiting for send() calls in progress")
        if self._committer is not None:
            await self._committer.close(self.settings.request_timeout_s + 1)
        if self._resender is not None:
            await self._resender.stop(max(0.0, deadline - time.monotonic()))
        elif timeout_s > 0:
            await self._flush_unstarted(deadline)
        left = await asyncio.to_thread(self.spool.pending_count)
        await self._sender.aclose()
        await asyncio.to_thread(self.spool.close)
        if left:
            log.warning(
                "msgbus_client: closed with %d message(s) left in spool %s; a client on the same "
                "spool_dir will send them",
                left,
                self.spool.path,
            )
        return left

    async def list_rejected(self, limit: int | None = None) -> list[RejectedMessage]:
        return await asyncio.to_thread(self.spool.list_rejected, limit)

    async def resend_rejected(self, message_id: str) -> bool:
        return await asyncio.to_thread(self.spool.resend_rejected, message_id)

    async def purge_rejected(self, message_id: str | None = None) -> int:
        return await asyncio.to_thread(self.spool.purge_rejected, message_id)

    def metrics(self) -> ClientMetrics:
        """Spool depth, oldest message age, counters (see msgbus_client.metrics). It reads
        LMDB (microseconds), so it is a plain method that a Prometheus scrape can call."""
        return metrics.snapshot(
            self.spool, self.counters, backing_off=self._health.backing_off()
        )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- internals ------------------------------------------------------------------------------

    async def _flush_unstarted(self, deadline: float) -> None:
        """close() on a client that never started: flush leftovers like the resender would."""
        resender = AsyncResender(self._resend_plan(), self._deliverer)
        await resender.stop(max(0.0, deadline - time.monotonic()))

    async def _commit_group(self, entries: list[Entry]) -> GroupResult:
        """One commit for the group; the resender delivers them."""
        refused = await asyncio.to_thread(self.spool.append, entries)
        if len(refused) < len(entries) and self._resender is not None:
            self._resender.wake()
        return group_results(self.spool, entries, refused)

    async def _spool_and_deliver(self, entry: Entry) -> None:
        """One commit, then the inline attempt if it may go; only the commit can raise."""
        allowed = inline_allowed(self.settings, self._backlog, self._health)
        if not allowed or self._inline_slots.locked():
            await asyncio.to_thread(self.spool.put, entry)
            self._leave_to_resender()
            return
        delivered = False
        async with self._inline_slots:
            self._in_flight.add(entry.key)  # only while this task delivers it
            try:
                await asyncio.to_thread(self.spool.put, entry)
                try:
                    delivered = not (await self._deliverer.deliver([entry])).retry
                except Exception:
                    log.exception("msgbus_client: inline delivery failed; the resender will retry")
            finally:
                self._in_flight.discard([entry.key])
        if not delivered:
            self._leave_to_resender()

    def _resend_plan(self) -> ResendPlan:
        return ResendPlan(self.settings, self._health, self._backlog, self.spool, self._in_flight)

    def _leave_to_resender(self) -> None:
        self._backlog.mark()
        if self._resender is not None:
            self._resender.wake()
