"""Broker switches: which brokers a destination has retired, and which a subscription consumes
while it drains them (dispatcher/drains.py)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import HttpUrl

from dispatcher.drains import DrainWatch, source_of
from msgbus.models import (
    BrokerKind,
    Destination,
    RetiredCluster,
    RuntimeConfig,
    Subscription,
    utcnow,
)
from msgbus.settings import ConnectionSettings
from msgbus.store.gate import MongoGate

KAFKA, RABBITMQ, DIRECT = BrokerKind.KAFKA, BrokerKind.RABBITMQ, BrokerKind.DIRECT


class _NoStore:
    """DrainWatch.sources_for reads nothing from MongoDB."""

    drains = None
    config = None
    gate = MongoGate(lambda: asyncio.sleep(0), component="test")


class _Registry:
    def __init__(self, runtime: RuntimeConfig) -> None:
        self._runtime = runtime

    def runtime(self) -> RuntimeConfig:
        return self._runtime


def _watch(runtime: RuntimeConfig | None = None, **connections: Any) -> DrainWatch:
    async def nothing() -> None:
        return None
    return DrainWatch(_NoStore(), _Registry(runtime or RuntimeConfig()),  # type: ignore[arg-type]
                      ConnectionSettings(**connections), nothing, settle_s=0, interval_s=1)


def _switched(*brokers: BrokerKind) -> Destination:
    destination = Destination(code="d", broker=brokers[0])
    for step, broker in enumerate(brokers[1:], start=1):
        destination = destination.with_broker(broker, utcnow() + timedelta(seconds=step))
    return destination


def _sub(ordered: bool = False) -> Subscription:
    return Subscription(destination="d", name="s", url=HttpUrl("http://127.0.0.1/hook"),
                        ordered_by_biz_id=ordered,
                        created_at=utcnow() - timedelta(seconds=10))


def test_every_broker_left_is_retired_oldest_first_and_one_used_again_is_current() -> None:
    assert [r.broker for r in _switched(KAFKA, RABBITMQ).retired] == [KAFKA]
    assert [r.broker for r in _switched(KAFKA, RABBITMQ, DIRECT).retired] == [KAFKA, RABBITMQ]
    abca = _switched(KAFKA, RABBITMQ, DIRECT, KAFKA)
    assert abca.broker is KAFKA and [r.broker for r in abca.retired] == [RABBITMQ]


def test_a_stored_previous_broker_is_read_as_retired() -> None:
    changed = utcnow()
    old = Destination.model_validate({"code": "d", "broker": "kafka",
                                      "previous_broker": "rabbitmq",
                                      "broker_changed_at": changed})
    assert [(r.broker, r.retired_at) for r in old.retired] == [(RABBITMQ, changed)]


def test_a_subscription_consumes_the_current_broker_and_each_undrained_one() -> None:
    watch, destination, sub = _watch(), _switched(KAFKA, RABBITMQ, DIRECT), _sub()
    assert watch.sources_for(destination, sub) == [(DIRECT, None), (KAFKA, None),
                                                   (RABBITMQ, None)]
    kafka = destination.retired[0]
    watch._drained.add((source_of("d", kafka), "s"))
    assert watch.sources_for(destination, sub) == [(DIRECT, None), (RABBITMQ, None)]


def test_a_subscription_created_after_a_switch_has_nothing_in_the_old_broker() -> None:
    destination = _switched(KAFKA, RABBITMQ)
    late = _sub().model_copy(update={"created_at": utcnow() + timedelta(seconds=5)})
    assert _watch().sources_for(destination, late) == [(RABBITMQ, None)]


def test_an_ordered_subscription_drains_the_oldest_broker_first() -> None:
    watch, destination, ordered = _watch(), _switched(KAFKA, RABBITMQ, DIRECT), _sub(True)
    assert watch.sources_for(destination, ordered) == [(KAFKA, None)]
    watch._drained.add((source_of("d", destination.retired[0]), "s"))
    assert watch.sources_for(destination, ordered) == [(RABBITMQ, None)]
    watch._let_go.add((source_of("d", destination.retired[1]), "s"))  # being confirmed empty
    assert watch.sources_for(destination, ordered) == []
    watch._drained.add((source_of("d", destination.retired[1]), "s"))
    assert watch.sources_for(destination, ordered) == [(DIRECT, None)]


def test_an_ordered_subscription_drains_a_retired_cluster_before_the_active_one() -> None:
    clusters = {"dc1": ["amqp://127.0.0.1:5672/%2F"], "dc2": ["amqp://127.0.0.1:5673/%2F"]}
    runtime = RuntimeConfig().with_active_cluster(RABBITMQ, "dc2", list(clusters), utcnow())
    assert runtime.retired_clusters == [RetiredCluster(
        broker=RABBITMQ, cluster="dc1", retired_at=runtime.retired_clusters[0].retired_at)]
    watch = _watch(runtime, rabbitmq_clusters=clusters, rabbitmq_url="")
    destination = Destination(code="d", broker=RABBITMQ)
    assert watch.sources_for(destination, _sub(True)) == [(RABBITMQ, "dc1")]
    assert watch.sources_for(destination, _sub()) == [(RABBITMQ, None)]  # every cluster
    watch._drained.add((source_of("d", runtime.retired_clusters[0]), "s"))
    assert watch.sources_for(destination, _sub(True)) == [(RABBITMQ, "dc2")]
    back = runtime.with_active_cluster(RABBITMQ, "dc1", list(clusters), utcnow())
    assert [r.cluster for r in back.retired_clusters] == ["dc2"]
