"""How many copies of a destination's messages its brokers keep, as the brokers describe them.

What is asked for comes from the settings (`Wanted`: MSGBUS_KAFKA_REPLICATION_FACTOR,
MSGBUS_KAFKA_MIN_INSYNC_REPLICAS, MSGBUS_RABBITMQ_QUEUE_TYPE); it applies when a topic or queue
is created, so an older one may differ. What each one got is read from the brokers:

* Kafka: the topic's partitions with their replicas and in-sync replicas (cluster metadata)
  and its `min.insync.replicas` (DescribeConfigs). A topic is under-replicated when a partition
  has fewer replicas than asked, or fewer in-sync replicas than min.insync.replicas (its
  acks=all producers are then refused).
* RabbitMQ: each subscription queue's type and, for a quorum queue, its members and those
  online (the management API). A classic queue where quorum was asked for keeps one copy; an
  ordered subscription's quorum queue without single active consumer does not keep order.

Each report lists its `problems` in words; the admin shows them (admin/replication.py) and the
dispatcher's broker-health monitor turns them into gauges and warnings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, ResourceType
from pydantic import BaseModel, Field

from msgbus.brokers._rabbit_consumer import QueueShape, QueueType
from msgbus.brokers.base import consumer_name
from msgbus.brokers.management import get_json_list, management_endpoints
from msgbus.models import BrokerKind, Destination, Subscription
from msgbus.settings import ConnectionSettings

KAFKA_TIMEOUT_S = 5.0
QUEUE_COLUMNS = "name,type,members,online,arguments"


class Wanted(BaseModel):
    """What the settings ask for (None: the broker's default, nothing is sent)."""

    kafka_replication_factor: int | None = None
    kafka_min_insync_replicas: int | None = None
    rabbitmq_queue_type: QueueType = "classic"

    @classmethod
    def of(cls, conn: ConnectionSettings) -> Wanted:
        return cls(kafka_replication_factor=conn.kafka_replication_factor,
                   kafka_min_insync_replicas=conn.kafka_min_insync_replicas,
                   rabbitmq_queue_type=conn.rabbitmq_queue_type)


class TopicCopies(BaseModel):
    topic: str
    exists: bool
    partitions: int = 0
    replication_factor: int | None = Field(
        default=None, description="the fewest replicas of any partition")
    fewest_in_sync: int | None = Field(
        default=None, description="the fewest in-sync replicas of any partition")
    min_insync_replicas: int | None = Field(
        default=None, description="the topic's min.insync.replicas (None: not described)")
    problems: list[str] = Field(default_factory=list)


class QueueCopies(BaseModel):
    subscription: str
    queue: str
    exists: bool
    type: str | None = None
    single_active_consumer: bool = False
    members: list[str] = Field(default_factory=list)
    online: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


class ClusterCopies(BaseModel):
    cluster: str
    reachable: bool
    error: str | None = None
    topic: TopicCopies | None = None
    queues: list[QueueCopies] = Field(default_factory=list)


class DestinationCopies(BaseModel):
    destination: str
    broker: BrokerKind
    wanted: Wanted
    clusters: list[ClusterCopies] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list, description="every cluster's, prefixed")


# -- Kafka (blocking: call in a thread) -------------------------------------------------------

def kafka_admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap,
                        "socket.timeout.ms": int(KAFKA_TIMEOUT_S * 1000)})


def describe_topic(admin: AdminClient, topic: str, wanted: Wanted,
                   metadata: ClusterMetadata | None = None) -> TopicCopies:
    """The topic as the cluster describes it (in `metadata`, else asked for); raises
    KafkaException when the cluster does not answer."""
    if metadata is None:
        metadata = admin.list_topics(timeout=KAFKA_TIMEOUT_S)
    found = metadata.topics.get(topic)
    if found is None or not found.partitions:
        return TopicCopies(topic=topic, exists=False)
    partitions = list(found.partitions.values())
    copies = TopicCopies(
        topic=topic, exists=True, partitions=len(partitions),
        replication_factor=min(len(p.replicas) for p in partitions),
        fewest_in_sync=min(len(p.isrs) for p in partitions),
        min_insync_replicas=_min_insync_replicas(admin, topic))
    copies.problems = topic_problems(copies, wanted)
    return copies


def _min_insync_replicas(admin: AdminClient, topic: str) -> int | None:
    """None when the broker does not describe the topic's configuration."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource])[resource].result(KAFKA_TIMEOUT_S)
    except (KafkaException, TimeoutError, ValueError):
        return None
    entry = entries.get("min.insync.replicas")
    try:
        return int(entry.value) if entry is not None and entry.value is not None else None
    except ValueError:
        return None


def topic_problems(copies: TopicCopies, wanted: Wanted) -> list[str]:
    problems: list[str] = []
    asked_rf, asked_isr = wanted.kafka_replication_factor, wanted.kafka_min_insync_replicas
    rf, isr = copies.replication_factor, copies.fewest_in_sync
    if asked_rf is not None and rf is not None and rf < asked_rf:
        problems.append(f"topic {copies.topic}: {rf} replica(s) per partition, "
                        f"{asked_rf} asked for")
    if asked_isr is not None and (copies.min_insync_replicas or 0) < asked_isr:
        described = copies.min_insync_replicas or "not described"
        problems.append(f"topic {copies.topic}: min.insync.replicas {described}, "
                        f"{asked_isr} asked for")
    floor = max(copies.min_insync_replicas or 0, asked_isr or 0)
    if isr is not None and isr < floor:
        problems.append(f"topic {copies.topic}: a partition has {isr} in-sync replica(s), "
                        f"below min.insync.replicas {floor}: acks=all publishes are refused")
    return problems


# -- RabbitMQ (the management API) --------------------------------------------------------------

async def queue_documents(http: httpx.AsyncClient, conn: ConnectionSettings, cluster: str,
                          nodes: list[str]) -> list[dict[str, Any]]:
    """Every queue of the cluster with the fields `describe_queue` reads, from the first node
    whose management API answers; raises httpx.HTTPError or ValueError when none does."""
    error: Exception = ValueError(f"no management API configured for {cluster}")
    for base, auth in management_endpoints(conn, cluster, nodes):
        try:
            return await get_json_list(http, f"{base}/api/queues?columns={QUEUE_COLUMNS}", auth)
        except (httpx.HTTPError, ValueError) as exc:
            error = exc
    raise error


def describe_queue(sub: Subscription, docs: dict[str, dict[str, Any]],
                   wanted: Wanted) -> QueueCopies:
    queue = consumer_name(sub.destination, sub.name)
    doc = docs.get(queue)
    if doc is None:  # declared when the first message is published or a dispatcher consumes
        return QueueCopies(subscription=sub.id, queue=queue, exists=False)
    arguments = doc.get("arguments") or {}
    copies = QueueCopies(
        subscription=sub.id, queue=queue, exists=True, type=str(doc.get("type") or "classic"),
        single_active_consumer=bool(arguments.get("x-single-active-consumer")),
        members=list(doc.get("members") or []), online=list(doc.get("online") or []))
    copies.problems = queue_problems(copies, sub.ordered_by_biz_id, wanted)
    return copies


def queue_problems(copies: QueueCopies, ordered: bool, wanted: Wanted) -> list[str]:
    problems: list[str] = []
    asked = QueueShape.wanted(wanted.rabbitmq_queue_type, ordered)
    if asked.type == "quorum" and copies.type == "classic":
        problems.append(f"queue {copies.queue}: classic (one copy) where quorum was asked for")
    if copies.type == "quorum":
        if ordered and not copies.single_active_consumer:
            problems.append(f"queue {copies.queue}: an ordered subscription's quorum queue "
                            "without single active consumer: per-key order is not kept")
        offline = sorted(set(copies.members) - set(copies.online))
        if offline:
            problems.append(f"queue {copies.queue}: quorum members offline: "
                            + ", ".join(offline))
    return problems


def by_name(docs: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(doc.get("name")): doc for doc in docs}


def destination_copies(destination: Destination, clusters: list[ClusterCopies],
                       wanted: Wanted) -> DestinationCopies:
    problems = [f"{c.cluster}: {p}" for c in clusters
                for p in [*(c.topic.problems if c.topic else []),
                          *(p for q in c.queues for p in q.problems)]]
    return DestinationCopies(destination=destination.code, broker=destination.broker,
                             wanted=wanted, clusters=clusters, problems=problems)

