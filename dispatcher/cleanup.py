"""`BrokerCleanup`: removes the broker resources of deleted subscriptions and destinations
(`msgbus.store.deletions`): a subscription's Kafka consumer group and RabbitMQ queue, a
destination's topic and exchange, on every configured cluster of each kind (a destination may
have switched).

A deletion is carried out once it is a few registry refreshes old (every service has dropped
the configuration by then) and no live dispatcher or compensator still pushes to it (their
heartbeats list what they push to): a consumer group with members cannot be deleted, and a
queue deleted under a consumer would be declared again by it. Every removal is idempotent, so
several dispatchers may run this at once; what fails is tried again at the next pass."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pika
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import AMQPError

from msgbus.brokers._rabbit_consumer import short_lived_connection
from msgbus.brokers.base import consumer_name, topic_name
from msgbus.models import BrokerKind, utcnow
from msgbus.settings import ConnectionSettings
from msgbus.store.deletions import DESTINATION, DeletionStore
from msgbus.store.shares import ShareStore
from msgbus.tasks import PeriodicWork

log = logging.getLogger(__name__)

GRACE_REFRESHES = 3  # registry refreshes after a deletion before its resources go
MIN_GRACE_S = 2.0
TIMEOUT_S = 10.0
_DONE_KAFKA_ERRORS = {KafkaError.GROUP_ID_NOT_FOUND, KafkaError.UNKNOWN_TOPIC_OR_PART}


class StillInUse(Exception):
    """A resource cannot be removed yet (e.g. a consumer group with members)."""


def remove_from_kafka(bootstrap: str, *, groups: list[str], topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures: dict[str, Any] = {}
    if groups:
        futures |= admin.delete_consumer_groups(groups, request_timeout=TIMEOUT_S)
    if topics:
        futures |= admin.delete_topics(topics, operation_timeout=TIMEOUT_S)
    for name, future in futures.items():
        try:
            future.result(timeout=TIMEOUT_S + 5)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code == KafkaError.NON_EMPTY_GROUP:
                raise StillInUse(f"kafka consumer group {name} has members") from exc
            if code not in _DONE_KAFKA_ERRORS:
                raise


def remove_from_rabbitmq(nodes: list[str], *, queues: list[str], exchanges: list[str]) -> None:
    with short_lived_connection(nodes) as connection:
        for queue in queues:
            _on_channel(connection, lambda ch, q=queue: ch.queue_delete(q))
        for exchange in exchanges:
            _on_channel(connection, lambda ch, x=exchange: ch.exchange_delete(x))


def _on_channel(connection: BlockingConnection, action: Any) -> None:
    """One removal on a channel of its own: a refusal closes only that channel."""
    channel = connection.channel()
    try:
        action(channel)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 404:  # already gone
            raise
    finally:
        if channel.is_open:
            channel.close()


class BrokerCleanup(PeriodicWork):
    def __init__(self, deletions: DeletionStore, shares: ShareStore,
                 connections: ConnectionSettings, *, interval_s: float) -> None:
        super().__init__()
        self._deletions = deletions
        self._shares = shares
        self._connections = connections
        self._grace_s = max(MIN_GRACE_S, GRACE_REFRESHES * connections.config_refresh_s)
        self.every(interval_s, self.run_once, what="broker cleanup",
                   ready=shares.gate.wait_available)

    async def run_once(self) -> int:
        """One pass; returns how many deletions it completed."""
        now = utcnow()
        pending = [d for d in await self._deletions.pending()
                   if d["deleted_at"].replace(tzinfo=now.tzinfo)
                   < now - timedelta(seconds=self._grace_s)]
        if not pending:
            return 0
        pushed_to = {sub for doc in (await self._shares.live_instances(now)).values()
                     for sub in doc.get("subscriptions", [])}
        completed = 0
        for deletion in pending:
            if _still_pushed_to(deletion, pushed_to):
                continue
            try:
                await asyncio.to_thread(self._remove, deletion)
            except (StillInUse, KafkaException, AMQPError, OSError) as exc:
                log.info("removing the broker resources of %s: not yet (%s)", deletion["_id"],
                         exc)
                continue
            await self._deletions.done(deletion, deletion["deleted_at"])
            log.info("removed the broker resources of %s", deletion["_id"])
            completed += 1
        return completed

    def _remove(self, deletion: dict[str, Any]) -> None:
        code = deletion["destination"]
        if deletion["kind"] == DESTINATION:
            groups, topics = [], [topic_name(code)]
        else:
            groups, topics = [consumer_name(code, deletion["name"])], []
        for nodes in self._connections.clusters(BrokerKind.KAFKA).values():
            remove_from_kafka(",".join(nodes), groups=groups, topics=topics)
        for nodes in self._connections.clusters(BrokerKind.RABBITMQ).values():
            remove_from_rabbitmq(nodes, queues=groups, exchanges=topics)


def _still_pushed_to(deletion: dict[str, Any], pushed_to: set[str]) -> bool:
    code = deletion["destination"]
    if deletion["kind"] == DESTINATION:
        return any(sub.startswith(f"{code}/") for sub in pushed_to)
    return f"{code}/{deletion['name']}" in pushed_to
