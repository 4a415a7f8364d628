"""`RabbitHub`: one AMQP connection to a cluster, shared by every subscription consumer of this
process, each on a channel of its own (issue 41: a thousand idle subscriptions must not cost a
thousand connections and a thousand threads).

The hub's thread owns the pika `BlockingConnection` (pika objects are not thread safe). It opens
a channel for each consumer that joins, polls the connection for all of them (an idle hub wakes
once a second, however many consumers it serves), hands each consumer's deliveries to its
buffer and runs the acks the event loop queues (`add_callback_threadsafe`, which also ends a
poll at once). What happens to one channel stays on it: a consumer refused by an ordered
queue's exclusive consumer stands by and asks again every `STANDBY_S`; a channel the broker
closes or whose consumer it cancels (a queue deleted) is opened again after a pause. When the
connection drops, every consumer drops what it had buffered from it (RabbitMQ hands every
unacked message out again) and the hub reconnects with backoff, starting at the next node.

A hub serves at most `CHANNELS_PER_HUB` consumers (RabbitMQ allows 2,047 channels per
connection by default); more open another hub. A hub with no consumer left closes its
connection and its thread ends.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pika
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import AMQPChannelError, AMQPError, ChannelClosedByBroker

from msgbus.backoff import backoff_s

if TYPE_CHECKING:
    from msgbus.brokers._rabbit_consumer import RabbitSubscriptionConsumer

log = logging.getLogger(__name__)

CHANNELS_PER_HUB = 1_000
RECONNECT_FIRST_S, RECONNECT_MAX_S = 0.5, 10.0
# A delivery or a request from the event loop ends a poll at once: the wait bounds only how
# soon a stand-by consumer asks again, so an idle hub wakes up once a second.
POLL_S = 1.0
STANDBY_S = 1.0  # how often a refused consumer of an ordered queue asks again
REOPEN_S = 1.0  # after a channel closed by the broker (not the connection)
_ACCESS_REFUSED = 403


class RabbitHub:
    def __init__(self, params: list[pika.URLParameters]) -> None:
        self._params = params
        self._lock = threading.Lock()  # guards the fields below
        self._members: set[RabbitSubscriptionConsumer] = set()
        self._joining: list[RabbitSubscriptionConsumer] = []
        self._leaving: list[tuple[RabbitSubscriptionConsumer, threading.Event]] = []
        self._connection: BlockingConnection | None = None
        self._thread: threading.Thread | None = None
        self._backoff = threading.Event()  # set to end a reconnect's wait early
        self._failures = 0
        self._received: set[RabbitSubscriptionConsumer] = set()  # the thread's only

    @property
    def size(self) -> int:
        with self._lock:
            return len(self._members)

    # -- any thread --------------------------------------------------------------------

    def attach(self, consumer: RabbitSubscriptionConsumer) -> None:
        """The consumer gets a channel on the hub's connection (at once, or once connected)."""
        with self._lock:
            self._members.add(consumer)
            self._joining.append(consumer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"rabbit-hub-{id(self):x}")
                self._thread.start()
        self._wake()

    def detach(self, consumer: RabbitSubscriptionConsumer) -> threading.Event:
        """Stop the consumer's channel (its acks queued so far are sent first); the event is
        set once that is done."""
        done = threading.Event()
        with self._lock:
            self._members.discard(consumer)
            if consumer in self._joining:
                self._joining.remove(consumer)
            self._leaving.append((consumer, done))
            running = self._thread is not None
        if not running:
            done.set()
        self._wake()
        return done

    def _wake(self) -> None:
        with self._lock:
            connection = self._connection
        self._backoff.set()
        if connection is not None:
            # ends the poll; a connection closed meanwhile: the loop sees the requests anyway
            with contextlib.suppress(AMQPError):
                connection.add_callback_threadsafe(lambda: None)

    def call(self, callback: Callable[[], None]) -> bool:
        """Run `callback` on the hub's thread; False when there is no connection now."""
        with self._lock:
            connection = self._connection
        if connection is None:
            return False
        try:
            connection.add_callback_threadsafe(callback)
            return True
        except AMQPError:
            return False

    # -- the hub's thread ----------------------------------------------------------------

    def _run(self) -> None:
        while self._has_work():
            start = self._failures % len(self._params)  # after a failure, the next node first
            try:
                self._serve(self._params[start:] + self._params[:start])
                continue  # every consumer left: the loop ends unless one joined meanwhile
            except AMQPError as exc:
                log.warning("rabbitmq hub %s: %r", self._name(), exc)
            except Exception:  # the loop never dies
                log.exception("rabbitmq hub %s failed", self._name())
            finally:
                self._connection_lost()
            self._failures += 1
            self._wait_to_reconnect(backoff_s(failures=self._failures,
                                              first_s=RECONNECT_FIRST_S, max_s=RECONNECT_MAX_S))

    def _wait_to_reconnect(self, delay_s: float) -> None:
        """Consumers that leave meanwhile are let go at once; all gone, the wait ends."""
        log.info("rabbitmq hub %s: reconnecting in %.1fs", self._name(), delay_s)
        deadline = time.monotonic() + delay_s
        while (remaining := deadline - time.monotonic()) > 0 and self._has_work():
            self._backoff.wait(remaining)
            self._backoff.clear()
            self._let_leavers_go()

    def _name(self) -> str:
        return ",".join(p.host + ":" + str(p.port) for p in self._params)

    def _has_work(self) -> bool:
        """False (and the thread is forgotten, so that the next attach starts one) when no
        consumer is left."""
        with self._lock:
            if self._members or self._joining or self._leaving:
                return True
            self._thread = None
            return False

    def _serve(self, params: list[pika.URLParameters]) -> None:
        connection = BlockingConnection(params)
        with self._lock:
            self._connection = connection
            self._joining = list(self._members)  # every consumer needs a channel on it
        self._failures = 0
        retry_at: dict[RabbitSubscriptionConsumer, float] = {}
        looked_at = time.monotonic()
        while True:
            self._let_leavers_go()
            self._open_joining(connection, retry_at)
            self._reopen_due(connection, retry_at)
            with self._lock:
                if not self._members and not self._joining and not self._leaving:
                    connection.close()
                    return
            connection.process_data_events(time_limit=POLL_S)
            # only the consumers that received something: a poll per delivery burst must not
            # cost a loop over a thousand idle ones
            received, self._received = self._received, set()
            for consumer in received:
                consumer.flush_incoming()
            if time.monotonic() - looked_at >= POLL_S:  # closed channels are rare: look seldom
                looked_at = time.monotonic()
                self._look_for_lost_channels(retry_at)

    def _look_for_lost_channels(self, retry_at: dict[RabbitSubscriptionConsumer, float]
                                ) -> None:
        with self._lock:
            members = list(self._members)
        for consumer in members:
            if consumer not in retry_at and consumer.channel_lost():
                retry_at[consumer] = time.monotonic() + REOPEN_S

    def received(self, consumer: RabbitSubscriptionConsumer) -> None:
        """Called on the hub's thread by a consumer's first delivery since its last hand-over:
        hand its deliveries over after this poll."""
        self._received.add(consumer)

    def _open_joining(self, connection: BlockingConnection,
                      retry_at: dict[RabbitSubscriptionConsumer, float]) -> None:
        with self._lock:
            joining, self._joining = self._joining, []
        for consumer in joining:
            self._open(consumer, connection, retry_at)

    def _reopen_due(self, connection: BlockingConnection,
                    retry_at: dict[RabbitSubscriptionConsumer, float]) -> None:
        now = time.monotonic()
        for consumer in [c for c, at in retry_at.items() if at <= now]:
            del retry_at[consumer]
            with self._lock:
                member = consumer in self._members
            if member:
                self._open(consumer, connection, retry_at)

    def _open(self, consumer: RabbitSubscriptionConsumer, connection: BlockingConnection,
              retry_at: dict[RabbitSubscriptionConsumer, float]) -> None:
        """A channel for the consumer; refused or failed, it is tried again later. A failure
        of the connection itself raises (the hub reconnects)."""
        try:
            consumer.open_on(connection)
        except AMQPChannelError as exc:
            consumer.close_channel()
            if (isinstance(exc, ChannelClosedByBroker) and consumer.exclusive
                    and exc.reply_code == _ACCESS_REFUSED):
                consumer.stand_by()
                retry_at[consumer] = time.monotonic() + STANDBY_S
            else:
                log.warning("rabbitmq consumer %s: %r", consumer.queue, exc)
                retry_at[consumer] = time.monotonic() + REOPEN_S

    def _let_leavers_go(self) -> None:
        with self._lock:
            leaving, self._leaving = self._leaving, []
        for consumer, done in leaving:
            try:
                consumer.close_channel()
            finally:
                done.set()

    def _connection_lost(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
            members = list(self._members)
        for consumer in members:
            consumer.connection_lost()
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception as exc:
                log.debug("rabbitmq hub %s: close: %r", self._name(), exc)


_hubs: dict[tuple[str, ...], list[RabbitHub]] = {}
_hubs_lock = threading.Lock()


def shared_hub(urls: str | Sequence[str], params: list[pika.URLParameters]) -> RabbitHub:
    """This process's hub for the cluster at `urls` with room for one more consumer."""
    key = (urls,) if isinstance(urls, str) else tuple(urls)
    with _hubs_lock:
        hubs = _hubs.setdefault(key, [])
        for hub in hubs:
            if hub.size < CHANNELS_PER_HUB:
                return hub
        hub = RabbitHub(params)
        hubs.append(hub)
        return hub
