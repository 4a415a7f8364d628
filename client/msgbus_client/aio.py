"""`AsyncMsgbusClient`: the asyncio producer client, same contract as `MsgbusClient`.

Spool work (LMDB, fsync) runs in worker threads (`asyncio.to_thread`) so the event loop never
blocks on the disk; HTTP goes through httpx.AsyncClient. The resender is a task, started by
`start()`, `async with`, or the first send(); use one client from one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self, Unpack

import httpx

from msgbus_client import metrics
from msgbus_client.base import DEFAULT_CLOSE_TIMEOUT_S, BaseClient, time_left
from msgbus_client.delivery import AsyncDeliverer
from msgbus_client.groupcommit import AsyncGroupCommitter, GroupResult
from msgbus_client.message import Entry, MessageOptions, build_entry
from msgbus_client.resender import AsyncResender
from msgbus_client.schemas import DestinationSchema, checked
from msgbus_client.spool import RejectedMessage
from msgbus_client.transport import AsyncHttpSender

log = logging.getLogger("msgbus_client")


class AsyncMsgbusClient(BaseClient[httpx.AsyncBaseTransport, AsyncDeliverer]):
    """asyncio producer client; options as for MsgbusClient (see `BaseClient`)."""

    _resender: AsyncResender | None

    def _connect(self, api_key: str, transport: httpx.AsyncBaseTransport | None) -> AsyncDeliverer:
        sender = AsyncHttpSender(self.settings, api_key, transport=transport)
        return AsyncDeliverer(self.spool, sender, self._health, self.counters)

    def _set_up(self) -> None:
        """The loop-bound parts (resender task, group committer) wait for start()."""
        self._inline_slots = asyncio.Semaphore(self.settings.max_inline_requests)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._committer: AsyncGroupCommitter | None = None
        self._idle: asyncio.Event | None = None

    # -- public API -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the resender (idempotent). It picks up what an earlier process left behind."""
        self._refuse_if_closed()
        loop = asyncio.get_running_loop()
        if self._loop is not None:
            if self._loop is not loop:
                raise RuntimeError("an AsyncMsgbusClient must be used from one event loop")
            return
        self._loop = loop
        self._idle = asyncio.Event()
        self._idle.set()
        self._resender = AsyncResender(self._resend_plan(), self._deliverer)
        self.spool.add_listener(self._resender.wake)
        if self.settings.group_commit:
            self._committer = AsyncGroupCommitter(
                self._commit_group, max_group=self.settings.max_group_messages
            )

    async def send(
        self, destination: str, message: object, **options: Unpack[MessageOptions]
    ) -> str:
        """Spool `message` durably and return its message id.

        Same contract, keywords and errors as MsgbusClient.send(). With group commit,
        concurrent send()s share a commit that starts as soon as the previous one ends.
        """
        try:
            schema = await self._schema_of(destination)
            entry = checked(build_entry(destination, message, **options), schema)
            await self.start()
            async with self._sending():
                if self._committer is not None:
                    await self._committer.submit(entry)
                else:
                    await self._spool_and_deliver(entry)
        except BaseException as exc:
            self.counters.send_error(exc)
            raise
        self.counters.add(metrics.SENT)
        return entry.message_id

    async def _schema_of(self, destination: object) -> DestinationSchema | None:
        due, held = self._schema_due(destination)
        if due and self._schemas is not None and isinstance(destination, str):
            answer = await self._deliverer.sender.get(self._schemas.path(destination))
            held = self._schemas.remember(destination, answer)
        return held

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
            await self._resender.stop(time_left(deadline))
        elif timeout_s > 0:  # never started: flush leftovers like the resender would
            await AsyncResender(self._resend_plan(), self._deliverer).stop(time_left(deadline))
        left = await asyncio.to_thread(self.spool.pending_count)
        await self._deliverer.sender.aclose()
        await asyncio.to_thread(self.spool.close)
        return self._closed_with(left)

    async def list_rejected(self, limit: int | None = None) -> list[RejectedMessage]:
        return await asyncio.to_thread(self.spool.list_rejected, limit)

    async def resend_rejected(self, message_id: str) -> bool:
        return await asyncio.to_thread(self.spool.resend_rejected, message_id)

    async def purge_rejected(self, message_id: str | None = None) -> int:
        return await asyncio.to_thread(self.spool.purge_rejected, message_id)

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

    @contextlib.asynccontextmanager
    async def _sending(self) -> AsyncIterator[None]:
        """Counts a send() in progress; close() waits until none is."""
        assert self._idle is not None  # start() made it
        self._active_sends += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active_sends -= 1
            if self._active_sends == 0:
                self._idle.set()

    async def _commit_group(self, entries: list[Entry]) -> GroupResult:
        """One commit for the group; the resender delivers them."""
        refused = await asyncio.to_thread(self.spool.append, entries)
        return self._committed(entries, refused)

    async def _spool_and_deliver(self, entry: Entry) -> None:
        """One commit, then the inline attempt if it may go; only the commit can raise."""
        if not self._inline_allowed() or self._inline_slots.locked():
            await asyncio.to_thread(self.spool.put, entry)
            self._leave_to_resender()
            return
        async with self._inline_slots:
            with self._in_flight.holding(entry.key):  # the resender skips it meanwhile
                await asyncio.to_thread(self.spool.put, entry)
                delivered = await self._deliver_inline(entry)
        if not delivered:
            self._leave_to_resender()

    async def _deliver_inline(self, entry: Entry) -> bool:
        try:
            return not (await self._deliverer.deliver([entry])).retry
        except Exception:
            return self._inline_failed()
