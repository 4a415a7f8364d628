"""What copies of a destination's messages its brokers keep, as they describe them.

`GET /v1/destinations/{code}/replication` (viewer) and the UI page
`/ui/destinations/{code}/replication`: on every configured cluster of the destination's broker,
the Kafka topic's partitions, replication factor, in-sync replicas and min.insync.replicas, or
each subscription queue's type and quorum members, beside what the settings ask for, with the
problems found (msgbus/replication.py). A cluster that does not answer is reported as such.
"""

from __future__ import annotations

import asyncio

import httpx
from confluent_kafka import KafkaException
from fastapi import APIRouter, Request
from fastapi.responses import Response

from admin.access import ReadsDestination
from admin.deps import Service, Store, UiUser
from admin.params import DestinationCode
from admin.ui import page
from msgbus.brokers.base import topic_name
from msgbus.models import BrokerKind, Destination, Subscription
from msgbus.replication import (
    ClusterCopies,
    DestinationCopies,
    Wanted,
    by_name,
    describe_queue,
    describe_topic,
    destination_copies,
    kafka_admin,
    queue_documents,
)
from msgbus.settings import ConnectionSettings
from msgbus.store import MongoStore

REQUEST_TIMEOUT_S = 5.0

router = APIRouter()
ui_router = APIRouter(include_in_schema=False)


async def copies_of(conn: ConnectionSettings, store: MongoStore, code: str) -> DestinationCopies:
    destination = await store.config.get_destination(code)
    subscriptions = await store.config.list_subscriptions(code)
    wanted = Wanted.of(conn)
    clusters: list[ClusterCopies] = []
    if destination.broker is BrokerKind.KAFKA:
        for cluster, nodes in conn.clusters(BrokerKind.KAFKA).items():
            clusters.append(await asyncio.to_thread(
                _kafka_cluster, cluster, ",".join(nodes), destination, wanted))
    elif destination.broker is BrokerKind.RABBITMQ:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:
            for cluster, nodes in conn.clusters(BrokerKind.RABBITMQ).items():
                clusters.append(await _rabbit_cluster(http, conn, cluster, nodes,
                                                      subscriptions, wanted))
    return destination_copies(destination, clusters, wanted)


def _kafka_cluster(cluster: str, bootstrap: str, destination: Destination,
                   wanted: Wanted) -> ClusterCopies:
    try:
        topic = describe_topic(kafka_admin(bootstrap), topic_name(destination.code), wanted)
    except KafkaException as exc:
        return ClusterCopies(cluster=cluster, reachable=False, error=f"kafka: {exc}")
    return ClusterCopies(cluster=cluster, reachable=True, topic=topic)


async def _rabbit_cluster(http: httpx.AsyncClient, conn: ConnectionSettings, cluster: str,
                          nodes: list[str], subscriptions: list[Subscription],
                          wanted: Wanted) -> ClusterCopies:
    try:
        docs = by_name(await queue_documents(http, conn, cluster, nodes))
    except (httpx.HTTPError, ValueError) as exc:
        return ClusterCopies(cluster=cluster, reachable=False,
                             error=f"rabbitmq management API: {exc}")
    return ClusterCopies(cluster=cluster, reachable=True,
                         queues=[describe_queue(s, docs, wanted) for s in subscriptions])


@router.get("/v1/destinations/{code}/replication")
async def destination_replication(code: DestinationCode, _: ReadsDestination, store: Store,
                                  service: Service) -> DestinationCopies:
    """How many copies of the destination's messages each cluster of its broker keeps, as the
    broker describes them, beside what the settings ask for, and the problems found."""
    return await copies_of(service.settings.connections, store, code)


@ui_router.get("/ui/destinations/{code}/replication", response_model=None)
async def replication_page(request: Request, code: str, who: UiUser, store: Store,
                           service: Service) -> Response:
    copies = await copies_of(service.settings.connections, store, code)
    return page(request, "replication.html", who, page="Destinations", copies=copies)
