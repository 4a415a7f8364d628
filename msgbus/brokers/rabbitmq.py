"""RabbitMQ adapter (pika): a destination is a durable topic exchange, a subscription a durable
queue bound to it with `#`.

Publisher: one pika `SelectConnection` on a private IOLoop in its own thread, a channel in
confirm mode. A `publish` call hands its batch to that thread (`add_callback_threadsafe`), which
publishes every message (persistent, mandatory) and tracks delivery tags, so a whole batch has
its confirms in flight together. Basic.Return marks a message unroutable; Basic.Nack, a lost
connection or the confirm timeout give an error outcome. The thread reconnects with backoff.

Consumer: `RabbitSubscriptionConsumer` (in `_rabbit_consumer`, re-exported here).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import pika
from pika.adapters.select_connection import IOLoop, SelectConnection
from pika.channel import Channel
from pika.exceptions import AMQPError
from pika.frame import Method
from pika.spec import Basic

from msgbus import codec
from msgbus.backoff import backoff_s
from msgbus.brokers._batch import PublishBatch
from msgbus.brokers._rabbit_consumer import (
    QueueShape,
    QueueType,
    RabbitSubscriptionConsumer,
    declare_topology,
)
from msgbus.brokers.base import Publisher, PublishOutcome, consumer_name, topic_name
from msgbus.errors import BrokerError
from msgbus.models import DEFAULT_CLUSTER, BrokerKind, Destination, Envelope, Subscription

__all__ = ["RabbitPublisher", "RabbitSubscriptionConsumer"]

log = logging.getLogger(__name__)

RECONNECT_FIRST_S, RECONNECT_MAX_S = 0.5, 10.0
WIRE_TYPE = "msgbus.MB1"  # AMQP `type`: the body is a codec-encoded envelope


def routing_key(envelope: Envelope) -> str:
    return envelope.biz_id or "-"


def _properties(envelope: Envelope) -> pika.BasicProperties:
    return pika.BasicProperties(
        message_id=envelope.message_id,
        content_type=envelope.content_type,
        type=WIRE_TYPE,
        delivery_mode=2,
    )


@dataclass(eq=False)
class _Job:
    exchange: str
    batch: PublishBatch
    tags: list[int] = field(default_factory=list)
    timer: object | None = None


class _ConfirmingPublisher:
    """Everything here runs on the IO thread, except `submit`, `start` and `stop`."""

    def __init__(self, urls: Sequence[str], confirm_timeout_s: float) -> None:
        self._nodes = [pika.URLParameters(url) for url in urls]
        self._node = 0  # the node to connect to next; moves on when one fails
        self._untried_at_start = len(self._nodes) - 1
        self._confirm_timeout_s = confirm_timeout_s
        self._ioloop = IOLoop()
        self._thread = threading.Thread(target=self._run, name="rabbit-publisher", daemon=True)
        self._inbox: deque[_Job] = deque()  # thread-safe append/popleft
        self._queue: deque[_Job] = deque()  # jobs waiting for an open channel
        self._connection: SelectConnection | None = None
        self._channel: Channel | None = None
        self._declared: set[str] = set()
        self._declaring: str | None = None
        self._next_tag = 0
        self._pending: dict[int, tuple[_Job, int]] = {}  # delivery tag -> (job, index)
        self._by_message_id: dict[str, deque[int]] = {}
        self._returned: dict[int, str] = {}
        self._failures = 0
        self._stopping = False
        self._first_open: concurrent.futures.Future[None] = concurrent.futures.Future()

    # -- called from other threads -------------------------------------------------------

    def start(self, timeout_s: float) -> None:
        self._thread.start()
        self._ioloop.add_callback_threadsafe(self._connect)
        try:
            self._first_open.result(timeout_s)
        except Exception as exc:
            self.stop()
            raise BrokerError(f"rabbitmq unreachable: {exc!r}") from exc

    def submit(self, job: _Job) -> None:
        self._inbox.append(job)
        self._ioloop.add_callback_threadsafe(self._take_inbox)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._thread.is_alive():
            self._ioloop.add_callback_threadsafe(self._shutdown)
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("rabbitmq publisher: IO thread did not stop within %.0fs", timeout_s)

    # -- IO thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                try:
                    self._ioloop.start()
                    return  # stop() was called
                except Exception:  # a callback failed: keep serving unless stopping
                    log.exception("rabbitmq publisher: IO loop error")
                    if self._stopping:
                        return
        finally:
            self._ioloop.close()

    def _connect(self) -> None:
        if self._stopping:
            return
        self._connection = SelectConnection(
            self._nodes[self._node],
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_connection_error,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._ioloop,
        )

    def _reconnect_later(self) -> None:
        if self._stopping:
            return
        self._failures += 1
        delay = backoff_s(failures=self._failures, first_s=RECONNECT_FIRST_S,
                          max_s=RECONNECT_MAX_S)
        self._ioloop.call_later(delay, self._connect)

    def _on_connection_open(self, connection: object) -> None:
        assert self._connection is not None
        self._connection.channel(on_open_callback=self._on_channel_open)

    def _on_connection_error(self, _connection: object, error: BaseException) -> None:
        self._connection = None
        if self._stopping:
            self._ioloop.stop()
            return
        self._node = (self._node + 1) % len(self._nodes)
        log.warning("rabbitmq publisher: connect failed: %r", error)
        if not self._first_open.done():
            if self._untried_at_start > 0:  # try every node once before giving up
                self._untried_at_start -= 1
                self._connect()
                return
            self._first_open.set_exception(error)
            return
        self._reconnect_later()

    def _on_connection_closed(self, _connection: object, reason: BaseException) -> None:
        self._channel = None
        self._connection = None
        self._fail_pending(f"rabbitmq: connection lost before confirm: {reason!r}")
        if self._stopping:
            self._ioloop.stop()
            return
        log.warning("rabbitmq publisher: connection closed: %r; reconnecting", reason)
        self._node = (self._node + 1) % len(self._nodes)
        self._reconnect_later()

    def _on_channel_open(self, channel: Channel) -> None:
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _f: self._on_ready(channel))

    def _on_ready(self, channel: Channel) -> None:
        self._channel = channel
        self._next_tag = 0
        self._declared.clear()
        self._declaring = None
        self._failures = 0
        if not self._first_open.done():
            self._first_open.set_result(None)
        log.info("rabbitmq publisher: channel open in confirm mode")
        self._publish_queued()

    def _on_channel_closed(self, channel: Channel, reason: BaseException) -> None:
        if self._channel is not None and self._channel is not channel:
            return
        self._channel = None
        self._fail_pending(f"rabbitmq: channel closed before confirm: {reason!r}")
        if self._declaring is not None:  # the declaration itself failed: fail its jobs
            while self._queue and self._queue[0].exchange == self._declaring:
                job = self._queue.popleft()
                job.batch.seal(f"rabbitmq: cannot declare {job.exchange}: {reason!r}")
                self._cancel_timer(job)
            self._declaring = None
        connection = self._connection
        if self._stopping or connection is None or not connection.is_open:
            return
        log.warning("rabbitmq publisher: channel closed: %r; reopening", reason)
        self._ioloop.call_later(0.2, self._reopen_channel)

    def _reopen_channel(self) -> None:
        connection = self._connection
        if not self._stopping and connection is not None and connection.is_open:
            connection.channel(on_open_callback=self._on_channel_open)

    def _shutdown(self) -> None:
        self._stopping = True
        for job in [*self._queue, *self._inbox]:
            job.batch.seal("rabbitmq: publisher closed")
        self._queue.clear()
        self._inbox.clear()
        connection = self._connection
        if connection is not None and connection.is_open:
            try:
                connection.close()  # _on_connection_closed stops the loop
                return
            except AMQPError as exc:
                log.debug("rabbitmq publisher: close: %r", exc)
        self._ioloop.stop()  # (pika cannot abort a connection that is still opening)

    def _take_inbox(self) -> None:
        while self._inbox:
            job = self._inbox.popleft()
            job.timer = self._ioloop.call_later(
                self._confirm_timeout_s, functools.partial(self._expire, job)
            )
            self._queue.append(job)
        self._publish_queued()

    def _publish_queued(self) -> None:
        """Publish queued jobs in order while the channel is open."""
        while self._queue and self._channel is not None and self._declaring is None:
            job = self._queue[0]
            if job.batch.sealed:
                self._queue.popleft()
                continue
            if job.exchange not in self._declared:
                self._declare(self._channel, job.exchange)
                return
            self._queue.popleft()
            self._publish(self._channel, job)

    def _declare(self, channel: Channel, exchange: str) -> None:
        """Declare (idempotently) the exchange before the first publish to it on this channel:
        a publish to a missing exchange would close the channel."""
        self._declaring = exchange

        def declared(_frame: object) -> None:
            if self._channel is channel:
                self._declared.add(exchange)
                self._declaring = None
                self._publish_queued()

        channel.exchange_declare(exchange, "topic", durable=True, callback=declared)

    def _publish(self, channel: Channel, job: _Job) -> None:
        for index, envelope in enumerate(job.batch.envelopes):
            try:
                body = codec.encode(envelope)
            except Exception as exc:
                job.batch.resolve(index, f"encode: {exc!r}")
                continue
            try:
                channel.basic_publish(
                    job.exchange, routing_key(envelope), body, _properties(envelope),
                    mandatory=True,
                )
            except AMQPError as exc:
                for rest in range(index, len(job.batch.envelopes)):
                    job.batch.resolve(rest, f"rabbitmq: publish failed: {exc!r}")
                return
            self._next_tag += 1
            self._pending[self._next_tag] = (job, index)
            self._by_message_id.setdefault(envelope.message_id, deque()).append(self._next_tag)
            job.tags.append(self._next_tag)
        self._finish_if_done(job)

    def _on_return(self, _channel: Channel, method: Basic.Return,
                   properties: pika.BasicProperties, _body: bytes) -> None:
        """Basic.Return of an unroutable mandatory message; its Basic.Ack follows."""
        message_id = properties.message_id or ""
        tags = self._by_message_id.get(message_id)
        if not tags:
            return
        tag = tags.popleft()  # returns arrive in publish order
        if not tags:
            del self._by_message_id[message_id]
        self._returned[tag] = (
            f"rabbitmq: unroutable ({method.reply_code} {method.reply_text}): no queue bound"
        )

    def _on_confirm(self, frame: Method) -> None:
        method = frame.method
        assert isinstance(method, Basic.Ack | Basic.Nack)
        tag: int = method.delivery_tag
        nack = isinstance(method, Basic.Nack)
        if method.multiple:
            # the dict holds tags in ascending order: take the prefix up to `tag`
            tags = list(itertools.takewhile(lambda t: t <= tag, self._pending))
        else:
            tags = [tag] if tag in self._pending else []
        touched: dict[int, _Job] = {}
        for t in tags:
            job, index = self._pending.pop(t)
            self._forget_tag(t, job, index)
            returned = self._returned.pop(t, None)
            error = "rabbitmq: nacked by broker" if nack else returned
            job.batch.resolve(index, error)
            touched[id(job)] = job
        for job in touched.values():
            self._finish_if_done(job)

    def _forget_tag(self, tag: int, job: _Job, index: int) -> None:
        message_id = job.batch.envelopes[index].message_id
        tags = self._by_message_id.get(message_id)
        if tags is not None and tag in tags:
            tags.remove(tag)
            if not tags:
                del self._by_message_id[message_id]

    def _finish_if_done(self, job: _Job) -> None:
        if job.batch.complete:
            self._cancel_timer(job)

    def _cancel_timer(self, job: _Job) -> None:
        if job.timer is not None:
            self._ioloop.remove_timeout(job.timer)
            job.timer = None

    def _expire(self, job: _Job) -> None:
        job.timer = None
        for tag in job.tags:
            entry = self._pending.pop(tag, None)
            if entry is not None:
                self._returned.pop(tag, None)
                self._forget_tag(tag, job, entry[1])
        job.batch.seal("rabbitmq: no confirm within timeout")

    def _fail_pending(self, reason: str) -> None:
        for job, index in self._pending.values():
            job.batch.resolve(index, reason)
            self._cancel_timer(job)
        self._pending.clear()
        self._by_message_id.clear()
        self._returned.clear()


class RabbitPublisher(Publisher):
    kind = BrokerKind.RABBITMQ

    def __init__(self, nodes: str | Sequence[str], *, cluster: str = DEFAULT_CLUSTER,
                 confirm_timeout_s: float = 10.0, connect_timeout_s: float = 10.0,
                 queue_type: QueueType = "classic") -> None:
        """`nodes`: the AMQP URLs of one cluster's nodes, tried in turn when one goes away;
        `queue_type`: what subscriptions' new queues are declared as."""
        self._queue_type: QueueType = queue_type
        self._urls = [nodes] if isinstance(nodes, str) else list(nodes)
        if not self._urls:
            raise ValueError("a RabbitMQ cluster needs at least one node URL")
        self.cluster = cluster
        self._confirm_timeout_s = confirm_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._io: _ConfirmingPublisher | None = None

    async def start(self) -> None:
        if self._io is not None:
            return
        try:
            io = _ConfirmingPublisher(self._urls, self._confirm_timeout_s)
        except (ValueError, TypeError, AMQPError) as exc:
            raise BrokerError(f"rabbitmq url: {exc}") from exc
        await asyncio.to_thread(io.start, self._connect_timeout_s)
        self._io = io

    async def ensure_topology(
        self, destination: Destination, subscriptions: Sequence[Subscription]
    ) -> None:
        exchange = topic_name(destination.code)
        queues = {consumer_name(destination.code, s.name):
                  QueueShape.wanted(self._queue_type, s.ordered_by_biz_id) for s in subscriptions}
        await asyncio.to_thread(declare_topology, self._urls, exchange, queues)

    async def publish(
        self, destination: Destination, envelopes: Sequence[Envelope]
    ) -> list[PublishOutcome]:
        if not envelopes:
            return []
        if self._io is None:
            raise BrokerError("RabbitPublisher is not started")
        batch = PublishBatch(asyncio.get_running_loop(), envelopes)
        self._io.submit(_Job(topic_name(destination.code), batch))
        try:  # the IO thread enforces the confirm timeout; this margin only guards against a hang
            await asyncio.wait_for(asyncio.shield(batch.done), self._confirm_timeout_s + 5.0)
        except TimeoutError:
            log.error("rabbitmq publisher: IO thread did not answer in time")
        return batch.seal("rabbitmq: no confirm within timeout")

    async def close(self) -> None:
        io, self._io = self._io, None
        if io is not None:
            await asyncio.to_thread(io.stop)
