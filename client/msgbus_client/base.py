"""`BaseClient`: what `MsgbusClient` and `AsyncMsgbusClient` share, as httpx's `BaseClient` is
for its `Client` and `AsyncClient`.

The base holds everything that does no I/O of its own: the one constructor (its keywords build
one `ClientSettings`), the spool, the receiver's health, counters and metrics, and the decisions
of send() and close(). A flavour adds only the blocking or awaiting calls: `_connect()` opens
its sender and deliverer, `_set_up()` its locks, group committer and resender, and it writes
send(), close() and the spool calls around them.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar, Unpack

import httpx

from msgbus_client import metrics
from msgbus_client.delivery import AsyncDeliverer, Backlog, Deliverer, InFlight, open_spool
from msgbus_client.errors import ClientClosedError
from msgbus_client.groupcommit import GroupResult
from msgbus_client.message import Entry
from msgbus_client.metrics import ClientCounters, ClientMetrics
from msgbus_client.resender import ResendPlan
from msgbus_client.retry import ReceiverHealth
from msgbus_client.schemas import DestinationSchema, SchemaCache
from msgbus_client.settings import ClientOptions, ClientSettings, StrPath

log = logging.getLogger("msgbus_client")

DEFAULT_CLOSE_TIMEOUT_S = 10.0

TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)
DelivererT = TypeVar("DelivererT", Deliverer, AsyncDeliverer)


class _Resender(Protocol):
    def wake(self) -> None: ...


class BaseClient(ABC, Generic[TransportT, DelivererT]):
    """Give a client `spool_dir`, a dir this process owns (a second owner gets
    SpoolLockedError), or `spool_root`, shared by several processes: each takes the first free
    `slot-N` below it. The other keywords (`ClientOptions`) are the `ClientSettings` fields of
    the same names, where their meaning and defaults are; `transport` replaces httpx's own (for
    tests or a custom network stack)."""

    _deliverer: DelivererT
    _resender: _Resender | None

    def __init__(
        self,
        receiver_url: str,
        api_key: str,
        *,
        spool_dir: StrPath | None = None,
        spool_root: StrPath | None = None,
        transport: TransportT | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        self.settings = ClientSettings.from_options(
            receiver_url, spool_dir=spool_dir, spool_root=spool_root, **options
        )
        if not api_key:
            raise ValueError("api_key must not be empty")
        self.spool = open_spool(self.settings)
        try:
            self.counters = ClientCounters()
            self._health = ReceiverHealth.for_settings(self.settings)
            self._deliverer = self._connect(api_key, transport)
            self._in_flight = InFlight()
            self._backlog = Backlog(present=self.spool.pending_count() > 0)
            self._resender = None
            self._active_sends = 0
            self._closed = False
            self._schemas = SchemaCache(self.settings.schema_ttl_s) if (
                self.settings.validate) else None
            self._set_up()
        except BaseException:
            self.spool.close()
            raise

    def metrics(self) -> ClientMetrics:
        """Spool depth, oldest message age, counters (see msgbus_client.metrics). It reads
        LMDB (microseconds), so it is a plain method in both clients, for a Prometheus scrape."""
        return metrics.snapshot(self.spool, self.counters, backing_off=self._health.backing_off())

    # -- what a flavour provides ----------------------------------------------------------------

    @abstractmethod
    def _connect(self, api_key: str, transport: TransportT | None) -> DelivererT:
        """Open this flavour's sender and its deliverer (settings, spool, health and counters
        exist already)."""

    @abstractmethod
    def _set_up(self) -> None:
        """This flavour's own parts: locks, group committer, resender. Called last by
        __init__; the spool is closed again if it raises."""

    # -- shared decisions -----------------------------------------------------------------------

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")

    def _inline_allowed(self) -> bool:
        """Whether send() may POST a fresh message itself: inline sends are on, no older
        message waits for the resender (it would be overtaken), and the receiver is not
        failing."""
        return self.settings.inline_send and not self._backlog and not self._health.backing_off()

    def _leave_to_resender(self) -> None:
        """A message stays in the spool for the resender; while it does, later ones do too."""
        self._backlog.mark()
        if self._resender is not None:
            self._resender.wake()

    def _resend_plan(self) -> ResendPlan:
        return ResendPlan(self.settings, self._health, self._backlog, self.spool, self._in_flight)

    def _committed(self, entries: Sequence[Entry], refused: Sequence[Entry]) -> GroupResult:
        """After a group's commit: wake the resender for what was written, and give each
        sender its result: None, or a spool-full error for an entry the spool refused."""
        if len(refused) < len(entries) and self._resender is not None:
            self._resender.wake()
        if not refused:
            return [None] * len(entries)
        refused_keys = {e.key for e in refused}
        return [self.spool.full_error(e) if e.key in refused_keys else None for e in entries]

    def _schema_due(self, destination: object) -> tuple[bool, DestinationSchema | None]:
        """Whether the destination's schema is to be fetched, and the one held."""
        if self._schemas is None or not isinstance(destination, str):
            return False, None
        return self._schemas.fresh(destination)

    def _inline_failed(self) -> bool:
        """An inline attempt raised (a bug, not a network failure: those are outcomes)."""
        log.exception("msgbus_client: inline delivery failed; the resender will retry")
        return False

    def _closed_with(self, left: int) -> int:
        """close()'s result: how many messages stay in the spool (logged when some do)."""
        if left:
            log.warning(
                "msgbus_client: closed with %d message(s) left in spool %s; a client on the same "
                "spool_dir will send them",
                left,
                self.spool.path,
            )
        return left


def time_left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
