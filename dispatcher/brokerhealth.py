"""`BrokerHealthMonitor`: the brokers' own view of their health, as gauges.

The bus's backlog per subscription (msgbus_subscription_backlog, from its own records) stays the
primary signal; these say *why* it grows:

* RabbitMQ, from the management API (`/api/nodes`, `/api/connections`, `/api/queues`) of each
  configured cluster: node running, memory and disk alarms, memory used, connections under flow
  control (blocked publishers), and the depth of each subscription's queue (ready, unacked).
  The API's figures lag a few seconds. Its URL is `rabbitmq_management_urls[cluster]`, or is
  derived from the cluster's amqp:// nodes (same host and credentials, port 15672).
* Kafka, per subscription of a Kafka destination: the consumer group's committed offset per
  partition and its lag (end offset - committed). Some brokers (tansu) advance the end offset
  per record batch, so lag is an upper bound there.
* MongoDB: whether it answers a ping (`msgbus_mongo_up`).
* Copies (dispatcher/copies.py): each subscription queue's type and quorum members, and each
  destination topic's replicas, in-sync replicas and min.insync.replicas, against the settings.

A cluster that does not answer sets `msgbus_broker_up{broker,cluster}` to 0 and keeps its last
figures; the poll never raises.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from dispatcher.copies import CopiesCheck
from msgbus.brokers.base import consumer_name, topic_name
from msgbus.brokers.kafka import committed_offsets
from msgbus.brokers.management import get_json_list, management_endpoints
from msgbus.metrics import (
    BROKER_UP,
    KAFKA_COMMITTED_OFFSET,
    KAFKA_CONSUMER_LAG,
    MONGO_UP,
    RABBITMQ_FLOW_CONNECTIONS,
    RABBITMQ_NODE_DISK_ALARM,
    RABBITMQ_NODE_MEMORY_ALARM,
    RABBITMQ_NODE_MEMORY_USED,
    RABBITMQ_NODE_RUNNING,
    RABBITMQ_QUEUE_MESSAGES,
)
from msgbus.models import BrokerKind, Subscription
from msgbus.replication import QUEUE_COLUMNS
from msgbus.settings import ConnectionSettings
from msgbus.tasks import PeriodicWork

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0
KAFKA_TIMEOUT_S = 5.0
FLOW_STATES = frozenset({"flow", "blocked", "blocking"})

# (subscription, its destination's broker) pairs to report on
SubscriptionsFn = Callable[[], list[tuple[Subscription, BrokerKind]]]


class BrokerHealthMonitor(PeriodicWork):
    def __init__(self, conn: ConnectionSettings, subscriptions: SubscriptionsFn, *,
                 interval_s: float, mongo_ping: Callable[[], Awaitable[bool]] | None = None,
                 service: str = "dispatcher") -> None:
        super().__init__()
        self._conn = conn
        self._subscriptions = subscriptions
        self._mongo_ping = mongo_ping
        self._service = service
        self._http = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S)
        self._copies = CopiesCheck(conn)
        self.every(interval_s, self.poll_once, what="broker health poll")

    async def close(self) -> None:
        await super().close()
        await self._http.aclose()

    async def poll_once(self) -> None:
        if self._mongo_ping is not None:
            MONGO_UP.labels(self._service).set(1 if await self._mongo_ping() else 0)
        subscriptions = self._subscriptions()
        for cluster, nodes in self._conn.clusters(BrokerKind.RABBITMQ).items():
            subs = [s for s, kind in subscriptions if kind is BrokerKind.RABBITMQ]
            up = await self._poll_rabbitmq(cluster, nodes, subs)
            BROKER_UP.labels("rabbitmq", cluster).set(1 if up else 0)
        for cluster, nodes in self._conn.clusters(BrokerKind.KAFKA).items():
            subs = [s for s, kind in subscriptions if kind is BrokerKind.KAFKA]
            up = await asyncio.to_thread(self._poll_kafka, cluster, ",".join(nodes), subs)
            BROKER_UP.labels("kafka", cluster).set(1 if up else 0)

    # --- RabbitMQ ---------------------------------------------------------------------------

    async def _poll_rabbitmq(self, cluster: str, nodes: list[str],
                             subscriptions: list[Subscription]) -> bool:
        """Any node's management API answers for the whole cluster: the first that does."""
        for base, auth in management_endpoints(self._conn, cluster, nodes):
            try:
                overview = await self._get_json(f"{base}/api/nodes", auth)
                connections = await self._get_json(
                    f"{base}/api/connections?columns=name,state", auth)
                queue_docs = await self._get_json(
                    f"{base}/api/queues?columns={QUEUE_COLUMNS},messages_ready,"
                    "messages_unacknowledged", auth)
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("RabbitMQ cluster %s: management API at %s: %s", cluster, base, exc)
                continue
            queues = {consumer_name(s.destination, s.name): s.id for s in subscriptions}
            self._record_rabbitmq(cluster, overview, connections, queue_docs, queues)
            self._copies.rabbitmq(cluster, queue_docs, subscriptions)
            return True
        return False

    async def _get_json(self, url: str, auth: tuple[str, str]) -> list[dict[str, Any]]:
        return await get_json_list(self._http, url, auth)

    @staticmethod
    def _record_rabbitmq(cluster: str, nodes: list[dict[str, Any]],
                         connections: list[dict[str, Any]], queue_docs: list[dict[str, Any]],
                         queues: dict[str, str]) -> None:
        for node in nodes:
            name = str(node.get("name", "?"))
            RABBITMQ_NODE_RUNNING.labels(cluster, name).set(1 if node.get("running") else 0)
            RABBITMQ_NODE_MEMORY_ALARM.labels(cluster, name).set(
                1 if node.get("mem_alarm") else 0)
            RABBITMQ_NODE_DISK_ALARM.labels(cluster, name).set(
                1 if node.get("disk_free_alarm") else 0)
            RABBITMQ_NODE_MEMORY_USED.labels(cluster, name).set(float(node.get("mem_used") or 0))
        flow = sum(1 for c in connections if c.get("state") in FLOW_STATES)
        RABBITMQ_FLOW_CONNECTIONS.labels(cluster).set(flow)
        for doc in queue_docs:
            sub_id = queues.get(str(doc.get("name")))
            if sub_id is None:  # not the queue of a subscription this service reports on
                continue
            RABBITMQ_QUEUE_MESSAGES.labels(cluster, sub_id, "ready").set(
                float(doc.get("messages_ready") or 0))
            RABBITMQ_QUEUE_MESSAGES.labels(cluster, sub_id, "unacked").set(
                float(doc.get("messages_unacknowledged") or 0))

    # --- Kafka (in a thread: confluent-kafka blocks) ------------------------------------------

    def _poll_kafka(self, cluster: str, bootstrap: str, subscriptions: list[Subscription]) -> bool:
        config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": bootstrap, "socket.timeout.ms": int(KAFKA_TIMEOUT_S * 1000)}
        admin = AdminClient(config)
        reader = Consumer({**config, "group.id": "msgbus-broker-health",
                           "enable.auto.commit": False})
        try:
            metadata = admin.list_topics(timeout=KAFKA_TIMEOUT_S)
            for sub in subscriptions:
                topic = topic_name(sub.destination)
                found = metadata.topics.get(topic)
                if found is None or not found.partitions:
                    continue
                try:
                    self._record_kafka(cluster, sub, admin, reader, topic,
                                       sorted(found.partitions))
                except KafkaException as exc:  # one group's answer; the cluster answered
                    log.warning("Kafka cluster %s: position of %s: %s", cluster, sub.id, exc)
            self._copies.kafka(cluster, admin, metadata, subscriptions)
            return True
        except KafkaException as exc:
            log.warning("Kafka cluster %s: %s", cluster, exc)
            return False
        finally:
            reader.close()

    @staticmethod
    def _record_kafka(cluster: str, sub: Subscription, admin: AdminClient, reader: Consumer,
                      topic: str, partitions: list[int]) -> None:
        committed = committed_offsets(admin, consumer_name(sub.destination, sub.name),
                                      [(topic, p) for p in partitions], KAFKA_TIMEOUT_S)
        lag = 0
        for partition in partitions:
            low, high = reader.get_watermark_offsets(TopicPartition(topic, partition),
                                                     timeout=KAFKA_TIMEOUT_S)
            offset = committed.get((topic, partition), -1)
            position = offset if offset >= 0 else low  # nothing committed: from the start
            KAFKA_COMMITTED_OFFSET.labels(cluster, sub.id, str(partition)).set(max(offset, 0))
            lag += max(0, high - position)
        KAFKA_CONSUMER_LAG.labels(cluster, sub.id).set(lag)
