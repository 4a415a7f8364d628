"""Delayed delivery survives kill -9 (issue 29 part 2): the dispatcher and the compensator, run
as separate OS processes, are killed while delayed messages wait; after restarts each message
arrives once, not before its time."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from msgbus_devtools.testkit.delays import lateness_s
from msgbus_devtools.testkit.deployment import SUBSCRIPTION, Deployment, Servers
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus.models import BrokerKind, DeliveryStatus

pytestmark = pytest.mark.serial

UNIQUE = uuid.uuid4().hex[:6]
DESTINATIONS = {f"late-k-{UNIQUE}": BrokerKind.KAFKA, f"late-r-{UNIQUE}": BrokerKind.RABBITMQ}
MESSAGES = 100  # per destination
DELAY_S = (12.0, 18.0)


@pytest.fixture
def deployment(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(private_servers, tmp_path, DESTINATIONS)
    yield deployed
    deployed.close()


def _in(deployment: Deployment, *statuses: DeliveryStatus) -> int:
    progress = deployment.store.progress
    return sum(deployment.run(progress.count_deliveries(f"{code}/{SUBSCRIPTION}", status))
               for code in DESTINATIONS for status in statuses)


def test_delays_survive_kill_9_of_the_dispatcher_and_the_compensator(
        deployment: Deployment) -> None:
    deployment.start(receivers=1)
    rng = random.Random(9)
    due: dict[str, datetime] = {}
    messages = []
    for code in DESTINATIONS:
        for i in range(MESSAGES):
            at = datetime.now(UTC) + timedelta(seconds=rng.uniform(*DELAY_S))
            message_id = uuid7()
            due[message_id] = at
            messages.append({"destination": code, "message_id": message_id, "body": {"n": i},
                             "deliver_at": at.isoformat()})
    post_batches(deployment.receivers[0].url, deployment.api_key, messages)

    assert deployment.dispatcher is not None
    eventually(lambda: _in(deployment, DeliveryStatus.SCHEDULED) >= MESSAGES // 2, 30,
               "some scheduled")
    deployment.dispatcher.kill9()  # some scheduled only in its trace buffer, some unacked
    deployment.compensator.kill9()
    deployment.dispatcher.start()
    # the restarted dispatcher records the rest as scheduled; one the broker hands it again
    # only when it is nearly due (a Kafka group waits for the dead member's session to end)
    # it holds in memory and delivers itself, with no compensator running
    eventually(lambda: _in(deployment, DeliveryStatus.SCHEDULED, DeliveryStatus.DELIVERED)
               == len(due), 60, "every delivery scheduled or delivered")
    replacement = deployment.add_compensator("compensator-2", scan_interval_s="0.5")
    replacement.start()

    eventually(lambda: {p.message_id for code in DESTINATIONS
                        for p in deployment.subscribers[code].pushes} >= set(due),
               max(DELAY_S) + 60, "every delayed message delivered")
    pushes = [p for code in DESTINATIONS for p in deployment.subscribers[code].pushes]
    late = lateness_s(pushes, due)
    assert min(late.values()) >= 0, "a message pushed before its time"
    assert max(late.values()) < 10, f"late by up to {max(late.values()):.1f} s"
    counts: dict[str, int] = {}
    for push in pushes:
        counts[push.message_id] = counts.get(push.message_id, 0) + 1
    twice = {m: n for m, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} pushed more than once"
