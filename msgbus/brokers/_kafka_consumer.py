"""Kafka subscription consumer: a consumer group per subscription, polled by its own thread.

The poll thread never stops calling `consume()` while the subscription is alive. When
`max_buffered` records are in flight (fetched and not yet acked: buffered plus handed out) it
pauses its assigned partitions and keeps polling, so a slow subscriber never causes a poll gap
and a rebalance; it resumes once the in-flight count falls to half of `max_buffered`.

Offsets are committed asynchronously, every `commit_interval_s` when the low-water mark moved,
and only up to the lowest offset still in flight per partition (see `_offsets`). On a revoke
the buffered records of revoked partitions are dropped (the partition's next owner reads them
again), the ones already handed out are awaited for up to `revoke_grace_s` (their outcome is
then recorded, so the next owner neither gets them again nor pushes a second first push beside
the compensator's retry), and what is done is committed synchronously. The whole group's
rebalance waits meanwhile, so the grace is one push's timeout plus a margin, at most
MAX_REVOKE_GRACE_S; an ordered subscription does not wait: its head may be retried in place
for minutes, and the next owner takes the key over from it.

A record appended before its partition was assigned to this consumer may have been handed out
before (to the previous owner, or to this one before a restart): it comes flagged
`redelivered`. One appended later cannot have been, so the dispatcher need not look it up; nor
can any record of a partition the group never committed an offset for (a new subscription's
backlog). The exception: a first member killed before its first commit (every
`commit_interval_s`); its successor then pushes again what it had pushed.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from msgbus import codec
from msgbus.backoff import backoff_s
from msgbus.brokers._buffer import ThreadedConsumer
from msgbus.brokers._offsets import OffsetToken, OffsetTracker, Partition
from msgbus.brokers.base import Received, consumer_name, topic_name
from msgbus.errors import BrokerError
from msgbus.models import BrokerKind, Envelope, Subscription

log = logging.getLogger(__name__)

_FETCH_BATCH = 500
_ERROR_LOG_INTERVAL_S = 10.0
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0  # after a failed poll step
# How far the clocks of the receivers (which stamp a record's timestamp) and this dispatcher
# may disagree before records appended before an assignment look newer than it.
CLOCK_MARGIN_S = 5.0
_COMMITTED_TIMEOUT_S = 5.0
# While the subscribed topic is unknown (a subscription that started before the receiver
# created its destination's topic), ask for the topic's metadata this often: librdkafka looks
# on its own only every topic.metadata.refresh.interval.ms, and its answer is what tells the
# group the topic is there (bench.topic_discovery; bench/RESULTS.md).
MISSING_TOPIC_LOOK_S = 1.0


MAX_REVOKE_GRACE_S = 10.0
IDLE_POLL_S = 1.0  # a poll's wait with nothing in flight (`_wait_s`)
# The longest a consumer that stops during its group's rebalance polls on for the rebalance to
# end before it leaves: on tansu, a member that left mid-rebalance stalled its group for minutes
# (docs/decisions.md, "A moved subscription is handed over, not overlapped").
SETTLE_BEFORE_LEAVING_S = 10.0
_RECORD_MARGIN_S = 2.0  # after the push's answer, its outcome is recorded before the ack


def revoke_grace_for(subscription: Subscription) -> float:
    """How long a revoke waits for what this member handed out (see the module docstring)."""
    if subscription.ordered_by_biz_id:
        return 0.0
    return min(MAX_REVOKE_GRACE_S, subscription.timeout_ms / 1000 + _RECORD_MARGIN_S)


def _offsets(moved: dict[Partition, int]) -> list[TopicPartition]:
    return [TopicPartition(topic, partition, offset) for (topic, partition), offset in
            moved.items()]


class KafkaSubscriptionConsumer(ThreadedConsumer):
    kind = BrokerKind.KAFKA

    def __init__(
        self,
        subscription: Subscription,
        *,
        bootstrap: str,
        max_buffered: int,
        # the brokers' default minimum: a killed dispatcher's partitions go to the others within
        # seconds (see docs/decisions.md, "A 6 s Kafka session timeout")
        session_timeout_ms: int = 6000,
        commit_interval_s: float = 0.5,
        revoke_grace_s: float | None = None,
        poll_timeout_s: float = 0.1,
        pause_after_s: float = 0.5,
        clock_margin_s: float = CLOCK_MARGIN_S,
        missing_topic_look_s: float | None = MISSING_TOPIC_LOOK_S,  # None: librdkafka's own
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(subscription, max_buffered=max(1, max_buffered))
        self._missing_topic_look_s = missing_topic_look_s
        self.group = consumer_name(subscription.destination, subscription.name)
        self.topic = topic_name(subscription.destination)
        self._commit_interval_s = commit_interval_s
        self._revoke_grace_s = (revoke_grace_s if revoke_grace_s is not None
                                else revoke_grace_for(subscription))
        self._poll_timeout_s = poll_timeout_s
        self._pause_after_s = pause_after_s
        self._clock_margin_s = clock_margin_s
        self._resume_at = self.max_buffered // 2
        self._config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": self.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "session.timeout.ms": session_timeout_ms,
            # A consumer may start before its topic exists: find it within seconds, not minutes.
            "topic.metadata.refresh.interval.ms": 10_000,
            "on_commit": self._on_commit,
            "error_cb": self._on_error,
            **(extra_config or {}),
        }
        self._tracker = OffsetTracker()
        self._lock = threading.Lock()  # guards _tracker (acks arrive on the event loop thread)
        self._acked = threading.Condition(self._lock)  # notified by every ack
        self._consumer: Consumer | None = None
        self._paused = False
        self._full_since: float | None = None
        self._room = threading.Event()  # set by ack() when in-flight drops below max_buffered
        self._reapply_flow = False  # the assignment changed: re-apply pause/resume
        self._last_commit = 0.0
        self._error_logged: dict[int, float] = {}
        self._topic_missing = False  # set by librdkafka's error callback, poll thread only
        self._looked_for_topic = 0.0
        self._assigned_at: dict[Partition, float] = {}  # poll thread only; wall clock
        self._never_committed: set[Partition] = set()  # poll thread only
        self.assignments = 0  # on_assign calls: one per rebalance this member took part in
        self._rebalancing = True  # poll thread only: joining, or revoked and not yet assigned
        self.pauses = 0  # times the partitions were paused because the subscriber lagged

    # -- event loop side ---------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is not None:
            return
        try:
            consumer = Consumer(self._config)
            consumer.subscribe(
                [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        except (KafkaException, ValueError, TypeError) as exc:
            raise BrokerError(f"kafka consumer {self.group}: {exc}") from exc
        self._consumer = consumer
        self._start_thread(f"kafka-{self.group}", functools.partial(self._run, consumer))

    def ack(self, received: Received) -> None:
        token = self._token(received, OffsetToken)
        with self._lock:
            self._tracker.ack(token)
            if self._tracker.in_flight < self.max_buffered:
                self._room.set()
            self._acked.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._tracker.in_flight

    # -- poll thread -------------------------------------------------------------------

    def _run(self, consumer: Consumer) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._step(consumer)
                failures = 0
            except Exception:  # the loop never dies: log, wait, keep polling
                failures += 1
                delay = backoff_s(failures=failures, first_s=RETRY_FIRST_S, max_s=RETRY_MAX_S)
                log.exception("kafka consumer %s: poll step failed, retrying in %.1fs",
                              self.group, delay)
                self._stop.wait(delay)
        self._shutdown(consumer)

    def _step(self, consumer: Consumer) -> None:
        with self._lock:
            in_flight = self._tracker.in_flight
        if in_flight < self.max_buffered:
            self._full_since = None
        elif not self._paused and self._in_grace():
            self._wait_for_room()
            self._commit(consumer)
            return
        self._flow_control(consumer, in_flight)
        if self._topic_missing and self._missing_topic_look_s is not None:
            self._look_for_topic(consumer, self._missing_topic_look_s)
        room = self.max_buffered - in_flight
        batch = 1 if self._paused else max(1, min(_FETCH_BATCH, room))
        messages = self._fetch(consumer, batch, self._wait_s(in_flight))
        if messages:
            self._handle(messages)
        self._commit(consumer)

    def _wait_s(self, in_flight: int) -> float:
        """How long a poll waits for a message. A message ends the wait at once; the wait
        bounds how soon acks are committed and paused partitions resume, which matter only
        while something is in flight, so an idle consumer wakes up once a second, not ten
        times (a dispatcher hosts hundreds of them)."""
        return self._poll_timeout_s if in_flight or self._paused else IDLE_POLL_S

    def _fetch(self, consumer: Consumer, batch: int, wait_s: float) -> list[Any]:
        """Up to `batch` messages, without waiting for a full batch.

        `consume(n, timeout)` returns only when n messages are there or the whole timeout has
        passed, so a batch-sized call holds a message that arrived alone for up to the poll
        timeout, which at a low rate becomes most of a message's latency (figures:
        bench/RESULTS.md, "Dispatcher"). So take what librdkafka has already fetched; when that
        is nothing, wait for one message, then take whatever came with it."""
        messages = consumer.consume(num_messages=batch, timeout=0)
        if messages:
            return messages
        messages = consumer.consume(num_messages=1, timeout=wait_s)
        if messages and batch > 1:
            messages += consumer.consume(num_messages=batch - 1, timeout=0)
        return messages

    def _look_for_topic(self, consumer: Consumer, interval_s: float) -> None:
        now = time.monotonic()
        if now - self._looked_for_topic < interval_s:
            return
        self._looked_for_topic = now
        try:
            found = consumer.list_topics(self.topic, timeout=interval_s)
        except KafkaException:
            return
        topic = found.topics.get(self.topic)
        if topic is not None and topic.error is None:
            self._topic_missing = False

    def _in_grace(self) -> bool:
        """Full, but not for long: wait for room before pausing.

        librdkafka drops a paused partition's prefetched records and only fetches again up to
        ~1 s after resume(), so pausing on every momentary full buffer would cap throughput.
        The grace (`pause_after_s`) bounds the poll gap far below the session timeout.
        """
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        return now - self._full_since < self._pause_after_s

    def _wait_for_room(self) -> None:
        self._room.clear()
        with self._lock:
            if self._tracker.in_flight < self.max_buffered:
                return
        self._room.wait(min(self._poll_timeout_s, self._pause_after_s))

    def _flow_control(self, consumer: Consumer, in_flight: int) -> None:
        limit = self._resume_at + 1 if self._paused else self.max_buffered
        want_pause = in_flight >= limit
        if want_pause == self._paused and not self._reapply_flow:
            return
        partitions = consumer.assignment()
        if partitions:
            if want_pause:
                consumer.pause(partitions)
                self.pauses += 1
            else:
                consumer.resume(partitions)
            log.debug("kafka consumer %s %s %d partitions (%d in flight)", self.group,
                      "paused" if want_pause else "resumed", len(partitions), in_flight)
        self.paused_partitions = len(partitions) if want_pause else 0
        self._paused = want_pause
        self._reapply_flow = False

    def _handle(self, messages: list[Message]) -> None:
        decoded: list[tuple[str, int, int, Envelope | None]] = []
        for message in messages:
            error = message.error()
            if error is not None:
                self._on_error(error)
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or offset is None:
                continue
            try:
                envelope: Envelope | None = codec.decode(message.value() or b"")
            except Exception as exc:  # undecodable: log it and treat it as done
                log.warning("kafka consumer %s: skipping undecodable record %s[%d]@%d: %r",
                            self.group, topic, partition, offset, exc)
                envelope = None
            if envelope is not None and self._appended_before_assignment(message):
                envelope.redelivered = True
            decoded.append((topic, partition, offset, envelope))
        items: list[Received] = []
        with self._lock:
            for topic, partition, offset, envelope in decoded:
                token = self._tracker.add(topic, partition, offset)
                if token is None:  # not assigned any more, or a re-fetch of a tracked offset
                    continue
                if envelope is None:
                    self._tracker.ack(token)
                else:
                    items.append(Received(envelope, token))
        self._buffer.put(items)

    def _appended_before_assignment(self, message: Message) -> bool:
        part = (message.topic() or "", message.partition() or 0)
        if part in self._never_committed:
            return False
        kind, stamp_ms = message.timestamp()
        assigned_at = self._assigned_at.get(part)
        if kind == TIMESTAMP_NOT_AVAILABLE or assigned_at is None:
            return True
        return bool(stamp_ms / 1000 < assigned_at + self._clock_margin_s)

    def _commit(self, consumer: Consumer, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_commit < self._commit_interval_s:
            return
        self._last_commit = now
        with self._lock:
            moved = self._tracker.to_commit()
        if not moved:
            return
        try:
            if force:
                consumer.commit(offsets=_offsets(moved), asynchronous=False)
            else:
                consumer.commit(offsets=_offsets(moved), asynchronous=True)
        except KafkaException as exc:
            log.warning("kafka consumer %s: commit failed: %s", self.group, exc)
            with self._lock:
                for tp, offset in moved.items():
                    self._tracker.commit_failed(tp, offset)

    def _shutdown(self, consumer: Consumer) -> None:
        self._let_rebalance_end(consumer)
        try:
            self._commit(consumer, force=True)
        except Exception:
            log.exception("kafka consumer %s: final commit failed", self.group)
        try:
            consumer.close()
        except Exception:
            log.exception("kafka consumer %s: close failed", self.group)
        with self._lock:
            self._tracker.reset()
        self._assigned_at.clear()
        self._never_committed.clear()
        self._consumer = None

    def _let_rebalance_end(self, consumer: Consumer) -> None:
        """Leave the group only once it is stable. What is fetched meanwhile is dropped: it was
        never handed out nor committed, so the next owner reads it."""
        deadline = time.monotonic() + SETTLE_BEFORE_LEAVING_S
        while self._rebalancing and time.monotonic() < deadline:
            try:
                consumer.consume(num_messages=_FETCH_BATCH, timeout=self._poll_timeout_s)
            except KafkaException as exc:
                log.warning("kafka consumer %s: leaving during a rebalance: %s", self.group, exc)
                return

    def _log_error(self, error: KafkaError) -> None:
        now = time.monotonic()
        if now - self._error_logged.get(error.code(), 0.0) >= _ERROR_LOG_INTERVAL_S:
            self._error_logged[error.code()] = now
            log.warning("kafka consumer %s: %s", self.group, error.str())

    # -- librdkafka callbacks (served on the poll thread) ------------------------------

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            self._topic_missing = True
        self._log_error(error)

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        failed = [tp for tp in partitions if error is not None or tp.error is not None]
        if not failed:
            return
        log.warning("kafka consumer %s: commit failed: %s", self.group,
                    error.str() if error is not None else failed[0].error)
        with self._lock:
            for tp in failed:
                self._tracker.commit_failed((tp.topic, tp.partition), tp.offset)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = [(tp.topic, tp.partition) for tp in partitions]
        with self._lock:
            self._tracker.assign(parts)
        now = time.time()
        self._assigned_at.update((part, now) for part in parts)
        self._never_committed = self._without_commits(consumer, partitions)
        self.assignments += 1
        self._rebalancing = False
        self._reapply_flow = True
        log.info("kafka consumer %s assigned %s", self.group, parts)

    def _without_commits(self, consumer: Consumer,
                         partitions: list[TopicPartition]) -> set[Partition]:
        """The partitions the group never committed an offset for; none when the broker does
        not say (every record then counts as possibly handed out before)."""
        try:
            committed = consumer.committed(partitions, timeout=_COMMITTED_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("kafka consumer %s: cannot read committed offsets (%s); every record "
                        "read before the assignment is looked up", self.group, exc)
            return set()
        return {(tp.topic, tp.partition) for tp in committed
                if tp.error is None and tp.offset == OFFSET_INVALID}

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalancing = True
        parts = [(tp.topic, tp.partition) for tp in partitions]
        dropped = self._settle(parts)
        with self._lock:
            moved = self._tracker.to_commit(parts)
        if moved:
            try:
                consumer.commit(offsets=_offsets(moved), asynchronous=False)
            except KafkaException as exc:
                log.warning("kafka consumer %s: commit on revoke failed: %s", self.group, exc)
        self._forget(parts, "revoked", dropped)

    def _drop_buffered(self, parts: list[Partition]) -> list[OffsetToken]:
        gone = set(parts)
        dropped = self._buffer.drop(lambda r: (r.token.topic, r.token.partition) in gone)
        return [self._token(received, OffsetToken) for received in dropped]

    def _settle(self, parts: list[Partition]) -> int:
        """Take back the buffered records of `parts` and wait (up to the grace; not while
        stopping, when nothing pushes any more) for the handed-out ones to be acked; returns
        how many were taken back."""
        dropped = self._drop_buffered(parts)
        lowest: dict[Partition, int] = {}
        for token in dropped:
            part = (token.topic, token.partition)
            lowest[part] = min(token.offset, lowest.get(part, token.offset))
        with self._lock:
            for part, offset in lowest.items():
                self._tracker.unfetch_from(part, offset)
            if self._stop.is_set() or self._revoke_grace_s <= 0:
                return len(dropped)
            started = time.monotonic()
            settled = self._acked.wait_for(lambda: self._tracker.in_flight_of(parts) == 0,
                                           timeout=self._revoke_grace_s)
            left = self._tracker.in_flight_of(parts)
        log.info("kafka consumer %s: revoke waited %.1f s for what was handed out%s",
                 self.group, time.monotonic() - started,
                 "" if settled else f"; {left} still in flight go to the next owner")
        return len(dropped)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalancing = True
        parts = [(tp.topic, tp.partition) for tp in partitions]
        self._forget(parts, "lost", len(self._drop_buffered(parts)))

    def _forget(self, parts: list[Partition], why: str, dropped: int) -> None:
        for part in parts:
            self._assigned_at.pop(part, None)
        with self._lock:
            self._tracker.revoke(parts)
        self._reapply_flow = True
        log.info("kafka consumer %s %s %s (dropped %d buffered)", self.group, why, parts, dropped)
