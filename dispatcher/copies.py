"""`CopiesCheck`: whether the brokers keep the copies of each message the settings ask for.

The broker-health monitor (dispatcher/brokerhealth.py) hands it what it read from each cluster;
the check (msgbus/replication.py) sets the gauges that the alerts MsgbusKafkaTopicUnderReplicated
and MsgbusRabbitMQQueueCopiesMismatch watch, and logs a warning when a topic's or queue's
problems change (not on every poll: the gauges carry the state).
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka.admin import AdminClient, ClusterMetadata

from msgbus.brokers.base import topic_name
from msgbus.metrics import (
    KAFKA_TOPIC_REPLICAS,
    KAFKA_TOPIC_UNDER_REPLICATED,
    RABBITMQ_QUEUE_COPIES_MISMATCH,
)
from msgbus.models import Subscription
from msgbus.replication import Wanted, by_name, describe_queue, describe_topic
from msgbus.settings import ConnectionSettings

log = logging.getLogger(__name__)


class CopiesCheck:
    def __init__(self, conn: ConnectionSettings) -> None:
        self._wanted = Wanted.of(conn)
        self._reported: dict[tuple[str, str], list[str]] = {}  # (cluster, what) -> problems

    def kafka(self, cluster: str, admin: AdminClient, metadata: ClusterMetadata,
              subscriptions: list[Subscription]) -> None:
        """Each destination topic with a subscription here (blocking: in a thread)."""
        for destination in sorted({s.destination for s in subscriptions}):
            copies = describe_topic(admin, topic_name(destination), self._wanted, metadata)
            if not copies.exists:
                continue
            gauge = KAFKA_TOPIC_REPLICAS
            gauge.labels(cluster, destination, "replication_factor").set(
                copies.replication_factor or 0)
            gauge.labels(cluster, destination, "in_sync").set(copies.fewest_in_sync or 0)
            if copies.min_insync_replicas is not None:
                gauge.labels(cluster, destination, "min_insync").set(copies.min_insync_replicas)
            KAFKA_TOPIC_UNDER_REPLICATED.labels(cluster, destination).set(
                1 if copies.problems else 0)
            self._report(cluster, copies.topic, copies.problems)

    def rabbitmq(self, cluster: str, queue_docs: list[dict[str, Any]],
                 subscriptions: list[Subscription]) -> None:
        docs = by_name(queue_docs)
        for sub in subscriptions:
            copies = describe_queue(sub, docs, self._wanted)
            if not copies.exists:
                continue
            RABBITMQ_QUEUE_COPIES_MISMATCH.labels(cluster, sub.id).set(
                1 if copies.problems else 0)
            self._report(cluster, copies.queue, copies.problems)

    def _report(self, cluster: str, what: str, problems: list[str]) -> None:
        before = self._reported.get((cluster, what), [])
        if problems == before:
            return
        self._reported[(cluster, what)] = problems
        if problems:
            log.warning("cluster %s keeps fewer copies than asked for: %s (docs/operations.md)",
                        cluster, "; ".join(problems))
        else:
            log.info("cluster %s: %s has the copies asked for again", cluster, what)
