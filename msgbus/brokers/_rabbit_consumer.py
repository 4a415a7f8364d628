"""RabbitMQ subscription consumer: a durable queue per subscription, consumed on a channel of
the process's shared connection (`RabbitHub`, msgbus/brokers/_rabbit_hub.py).

The hub's thread declares the topology, sets `basic_qos(prefetch_count=max_buffered)` on the
consumer's channel and hands its deliveries to a buffer the event loop reads. Acks are queued
and handed to that thread with `add_callback_threadsafe`, one wake-up per burst. When the
channel or the connection goes, messages buffered from it are dropped (RabbitMQ redelivers
every unacked message: at-least-once).

A queue is classic or quorum (`MSGBUS_RABBITMQ_QUEUE_TYPE`: replicated on the cluster's nodes).
Its type is fixed when it is first declared; a queue that exists with another shape is used as
it is and the mismatch is logged (`declare_queue`), and reported by the admin and the
broker-health monitor (msgbus/replication.py).

An ordered subscription's queue has one consumer at a time, whatever the number of
dispatchers. On a classic queue it consumes with `exclusive=True`; the others are refused (403)
and ask again every STANDBY_S (`_rabbit_hub.py`), so one of them takes over within about that
long after the active one is gone (its unacked messages go back to the head of the queue).
Quorum queues ignore `exclusive` (RabbitMQ 3.10 accepts a second exclusive consumer), so an
ordered quorum queue is declared with `x-single-active-consumer`: the broker keeps the others
waiting and hands the queue to one of them when the active one goes (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pika
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import AMQPError, ChannelClosedByBroker
from pika.spec import Basic

from msgbus import codec
from msgbus.brokers._buffer import BufferedConsumer
from msgbus.brokers._rabbit_hub import RabbitHub, shared_hub
from msgbus.brokers.base import Received, consumer_name, topic_name
from msgbus.errors import BrokerError
from msgbus.models import BrokerKind, Subscription

log = logging.getLogger(__name__)

_MAX_PREFETCH = 65_535
_PRECONDITION_FAILED = 406
QueueType = Literal["classic", "quorum"]


@dataclass(frozen=True, slots=True)
class QueueShape:
    """What a subscription's queue is declared as: its type, and for an ordered quorum queue
    RabbitMQ's single active consumer."""

    type: QueueType = "classic"
    single_active: bool = False

    @classmethod
    def wanted(cls, queue_type: QueueType, ordered: bool) -> QueueShape:
        return cls(queue_type, single_active=queue_type == "quorum" and ordered)

    def __str__(self) -> str:
        return f"{self.type}{' with single active consumer' if self.single_active else ''}"

    def arguments(self) -> dict[str, Any]:
        if self.type == "classic":  # as queues were always declared: no arguments
            return {}
        args: dict[str, Any] = {"x-queue-type": "quorum"}
        if self.single_active:
            args["x-single-active-consumer"] = True
        return args


# every shape msgbus declares, tried in turn when a queue exists with another one
SHAPES = (QueueShape("classic"), QueueShape("quorum"), QueueShape("quorum", single_active=True))


def declare_queue(channel: BlockingChannel, queue: str, wanted: QueueShape
                  ) -> tuple[BlockingChannel, QueueShape | None]:
    """Declare `queue` as `wanted`; a queue that exists with another shape cannot be declared
    again with this one (PRECONDITION_FAILED, which closes the channel), so the other shapes are
    tried on a new channel and the one that matches is used as it is. Returns the channel to go
    on with and the queue's shape (None: none of msgbus's, e.g. made by hand)."""
    for shape in (wanted, *(s for s in SHAPES if s != wanted)):
        try:
            channel.queue_declare(queue, durable=True, arguments=shape.arguments())
        except ChannelClosedByBroker as exc:
            if exc.reply_code != _PRECONDITION_FAILED:
                raise
            channel = channel.connection.channel()
            continue
        if shape != wanted:
            log.warning("rabbitmq queue %s exists as %s, not %s as configured: kept as it is "
                        "(docs/operations.md: migrating a queue)", queue, shape, wanted)
        return channel, shape
    channel.queue_declare(queue, passive=True)
    log.warning("rabbitmq queue %s exists with arguments msgbus does not declare: kept", queue)
    return channel, None


def declare_on(channel: BlockingChannel, exchange: str, queues: dict[str, QueueShape]
               ) -> tuple[BlockingChannel, dict[str, QueueShape | None]]:
    """The destination's durable topic exchange and each subscription's durable queue on it;
    returns the channel to go on with and each queue's shape (see `declare_queue`)."""
    channel.exchange_declare(exchange, "topic", durable=True)
    shapes: dict[str, QueueShape | None] = {}
    for queue, wanted in queues.items():
        channel, shapes[queue] = declare_queue(channel, queue, wanted)
        channel.queue_bind(queue, exchange, routing_key="#")
    return channel, shapes


def node_parameters(urls: str | Sequence[str]) -> list[pika.URLParameters]:
    """Connection parameters of a cluster's nodes; pika tries them in turn."""
    try:
        return [pika.URLParameters(url) for url in ([urls] if isinstance(urls, str) else urls)]
    except ValueError as exc:
        raise BrokerError(f"rabbitmq url: {exc}") from exc


@contextlib.contextmanager
def short_lived_connection(urls: str | Sequence[str]) -> Iterator[BlockingConnection]:
    """A connection to one cluster for a few calls, closed after them."""
    connection = BlockingConnection(node_parameters(urls))
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


def declare_topology(urls: str | Sequence[str], exchange: str,
                     queues: dict[str, QueueShape]) -> None:
    """Declare (idempotently) over a short-lived connection; raises BrokerError."""
    try:
        with short_lived_connection(urls) as connection:
            try:
                declare_on(connection.channel(), exchange, queues)
            except AMQPError as exc:
                raise BrokerError(f"rabbitmq: cannot declare {exchange}: {exc!r}") from exc
    except (AMQPError, ValueError) as exc:
        raise BrokerError(f"rabbitmq unreachable: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class AmqpToken:
    delivery_tag: int
    channel: int  # the channel it came on: tags mean nothing on another one


class RabbitSubscriptionConsumer(BufferedConsumer):
    kind = BrokerKind.RABBITMQ

    def __init__(self, subscription: Subscription, *, url: str | Sequence[str],
                 max_buffered: int, queue_type: QueueType = "classic") -> None:
        super().__init__(subscription, max_buffered=min(max(1, max_buffered), _MAX_PREFETCH))
        self.queue = consumer_name(subscription.destination, subscription.name)
        self.exchange = topic_name(subscription.destination)
        self._url = url
        self._hub: RabbitHub | None = None
        self._lock = threading.Lock()  # guards the fields below
        self._channel: BlockingChannel | None = None
        self._opened = 0  # channels opened so far: the current one's number, for ack tokens
        self._acks: list[int] = []
        self._ack_scheduled = False
        self._incoming: list[Received] = []  # hub thread only: filled by callbacks, then flushed
        self._cancelled = False  # hub thread only: the broker cancelled the consumer
        self._ordered = subscription.ordered_by_biz_id
        self._wanted = QueueShape.wanted(queue_type, self._ordered)
        self.exclusive = self._ordered  # on a classic queue; set per channel
        self.standing_by = False  # refused: another process consumes the ordered queue
        self.connections = 0  # channels it consumed on, for tests and metrics

    # -- event loop side ---------------------------------------------------------------

    async def start(self) -> None:
        if self._hub is not None:
            return
        self._bind_buffer()
        self._hub = shared_hub(self._url, node_parameters(self._url))
        self._hub.attach(self)

    async def close(self) -> None:
        hub, self._hub = self._hub, None
        if hub is None:
            return
        await asyncio.to_thread(hub.detach(self).wait)
        self._buffer.close()

    def ack(self, received: Received) -> None:
        token = self._token(received, AmqpToken)
        with self._lock:
            if token.channel != self._opened or self._channel is None:
                return  # that channel is gone; RabbitMQ hands the message out again
            self._acks.append(token.delivery_tag)
            if self._ack_scheduled:
                return
            self._ack_scheduled = True
        hub = self._hub
        if hub is None or not hub.call(self._flush_acks):
            log.debug("rabbitmq consumer %s: ack after disconnect", self.queue)

    # -- the hub's thread --------------------------------------------------------------

    def open_on(self, connection: BlockingConnection) -> None:
        """Declare the queue and consume it on a new channel of `connection`."""
        channel, shapes = declare_on(connection.channel(), self.exchange,
                                     {self.queue: self._wanted})
        self.exclusive = self._ordered and self._consumes_exclusive(shapes[self.queue])
        with self._lock:
            self._opened += 1
            number = self._opened
            self._channel = channel
            self._acks.clear()
            self._ack_scheduled = False
        self._cancelled = False
        channel.basic_qos(prefetch_count=self.max_buffered)
        channel.add_on_cancel_callback(self._on_cancel)
        channel.basic_consume(self.queue, functools.partial(self._on_message, number),
                              exclusive=self.exclusive)
        self.standing_by = False
        self.connections += 1
        log.info("rabbitmq consumer %s: consuming (prefetch %d%s)", self.queue,
                 self.max_buffered, ", the only consumer" if self.exclusive
                 else ", one active at a time" if self._wanted.single_active else "")

    def stand_by(self) -> None:
        if not self.standing_by:
            self.standing_by = True
            log.info("rabbitmq consumer %s: another process consumes this ordered queue; "
                     "standing by", self.queue)

    def channel_lost(self) -> bool:
        """Whether its channel was closed, or its consumer cancelled, by the broker (then the
        channel is let go, and what it buffered dropped)."""
        with self._lock:
            channel = self._channel
        if channel is None or (channel.is_open and not self._cancelled):
            return False
        log.warning("rabbitmq consumer %s: %s by the broker; consuming again shortly",
                    self.queue, "consumer cancelled" if self._cancelled else "channel closed")
        self.close_channel()
        return True

    def close_channel(self) -> None:
        """Send the acks queued so far, close the channel, drop what it buffered."""
        self._flush_acks()
        with self._lock:
            channel, self._channel = self._channel, None
        self._forget(self._opened)
        if channel is not None and channel.is_open:
            try:
                channel.close()
            except AMQPError as exc:
                log.debug("rabbitmq consumer %s: close: %r", self.queue, exc)

    def connection_lost(self) -> None:
        with self._lock:
            self._channel = None
        self._forget(self._opened)

    def _forget(self, number: int) -> None:
        with self._lock:
            self._acks.clear()
            self._ack_scheduled = False
        self._incoming.clear()
        dropped = len(self._buffer.drop(lambda r: r.token.channel == number))
        if dropped:
            log.info("rabbitmq consumer %s: dropped %d buffered messages of a closed channel",
                     self.queue, dropped)

    def _consumes_exclusive(self, shape: QueueShape | None) -> bool:
        """Whether this ordered subscription needs an exclusive consumer: on a classic queue
        (or one of unknown shape) yes; a quorum queue ignores it, and keeps one consumer at a
        time only with single active consumer."""
        if shape is None or shape.type == "classic":
            return True
        if not shape.single_active:
            log.error("rabbitmq queue %s of an ordered subscription is a quorum queue without "
                      "single active consumer: every dispatcher consumes it and per-key order "
                      "is not kept (docs/operations.md: migrating a queue)", self.queue)
        return False

    def _on_cancel(self, _frame: object) -> None:
        self._cancelled = True

    def _on_message(self, number: int, channel: BlockingChannel, method: Basic.Deliver,
                    _properties: pika.BasicProperties, body: bytes) -> None:
        tag = method.delivery_tag
        try:
            envelope = codec.decode(body)
        except Exception as exc:  # undecodable: log it and treat it as done
            log.warning("rabbitmq consumer %s: dropping undecodable message (tag %d): %r",
                        self.queue, tag, exc)
            channel.basic_ack(tag)
            return
        envelope.redelivered = envelope.redelivered or bool(method.redelivered)
        if not self._incoming and self._hub is not None:
            self._hub.received(self)
        self._incoming.append(Received(envelope, AmqpToken(tag, number)))

    def flush_incoming(self) -> None:
        if self._incoming:
            items, self._incoming = self._incoming, []
            self._buffer.put(items)

    def _flush_acks(self) -> None:
        with self._lock:
            tags, self._acks = self._acks, []
            self._ack_scheduled = False
            channel = self._channel
        if channel is None or not channel.is_open:
            return
        for tag in sorted(tags):
            channel.basic_ack(tag)
