"""One concurrency cap per subscription, whatever pushes to it: three dispatchers and two
compensators as separate OS processes, and a replay running in a compensator, push to one
subscription with `max_concurrency: 4`; a subscriber that answers in 100 ms counts the pushes
it has at once. Every fifth message fails its first push (the compensators retry it), and one
dispatcher is killed with SIGKILL mid-run: its share goes to the others when its lease ends."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from admin.pushers import pushers_of
from msgbus.models import BrokerKind, ReplaySpec, ReplayState, utcnow
from msgbus.store.replays import ReplayStore
from tests.support.bus import wait_until
from tests.support.deployment import SUBSCRIPTION, Deployment, Servers, wait_with_progress
from tests.support.procs import say
from tests.support.subscriber import PeakSubscriber

CAP = 4
PUSH_S = 0.1
MESSAGES = 240
LEASE_S = 3.0


def _fails_first(message_id: str) -> bool:
    return int(message_id[-2:], 16) % 5 == 0


@pytest.fixture
def deployment(private_servers: Servers, tmp_path: Path,
               request: pytest.FixtureRequest) -> Iterator[Deployment]:
    private_servers.restart_stopped()
    broker: BrokerKind = request.param
    deployed = Deployment(private_servers, tmp_path,
                          {f"cap-{broker.value[0]}-{uuid.uuid4().hex[:6]}": broker})
    deployed.subscriber_factory = lambda: PeakSubscriber(delay_s=PUSH_S,
                                                         fails_first=_fails_first)
    deployed.subscription_options = {"max_concurrency": CAP,
                                     "retry_policy": {"delays_s": [1.0]}}
    deployed.extra_env = {"MSGBUS_SHARE_HEARTBEAT_S": "0.5",
                          "MSGBUS_SHARE_LEASE_S": str(LEASE_S)}
    yield deployed
    deployed.close()


def _start_replay(deployment: Deployment, code: str, since_s: float) -> None:
    """A running replay of everything sent so far, pushed by a compensator beside its
    retries."""
    now = utcnow()
    spec = ReplaySpec(destination=code, since=now - timedelta(seconds=since_s),
                      until=now + timedelta(seconds=1), rate_per_s=50)
    replays = ReplayStore(deployment.store)

    async def start() -> None:
        job = await replays.create(spec, [f"{code}/{SUBSCRIPTION}"], 0, "test")
        await replays.transition(job["_id"], (ReplayState.PLANNED,), ReplayState.RUNNING,
                                 "test")

    deployment.run(start())


@pytest.mark.parametrize("deployment", [BrokerKind.KAFKA, BrokerKind.RABBITMQ],
                         indirect=True, ids=["kafka", "rabbitmq"])
def test_three_dispatchers_two_compensators_and_a_replay_share_one_cap(
        deployment: Deployment) -> None:
    code = next(iter(deployment.destinations))
    deployment.start(receivers=1)
    more = [deployment.add_dispatcher("dispatcher-1"), deployment.add_dispatcher("dispatcher-2"),
            deployment.add_compensator("compensator-1", scan_interval_s="0.5")]
    for process in more:
        process.start()
    subscriber = deployment.subscribers[code]
    assert isinstance(subscriber, PeakSubscriber)
    began = time.monotonic()
    load = deployment.load(rate_per_s=MESSAGES / 2, duration_s=2).start()
    load.join()
    accepted = load.accepted_ids()
    assert len(accepted) == MESSAGES, load.summary()
    _start_replay(deployment, code, time.monotonic() - began + 5)

    sub_id = f"{code}/{SUBSCRIPTION}"

    def pushers() -> dict[str, int]:
        view = deployment.run(pushers_of(deployment.store, sub_id))
        return {p["instance"]: p["share"] for p in view["pushers"]}

    wait_until(lambda: {f"dispatcher:dispatcher{n}" for n in ("", "-1", "-2")} <= set(pushers()),
               30, "the three dispatchers among the subscription's pushers")
    wait_until(lambda: len(subscriber.pushes) >= MESSAGES // 3, 60, "a third of the pushes")
    more[0].kill9()  # dispatcher-1, mid-run
    wait_until(lambda: "dispatcher:dispatcher-1" not in pushers(), 10 * LEASE_S,
               "the killed dispatcher gone from the pushers after its lease")
    assert sum(pushers().values()) <= CAP
    def delivered() -> tuple[int, int]:
        return len(accepted & set(subscriber.successes())), len(accepted)

    wait_with_progress("every message delivered", delivered, 120)
    took_s = time.monotonic() - began
    pushes = len(subscriber.pushes)
    say(f"{pushes} pushes in {took_s:.1f} s ({pushes / took_s:.1f}/s; the cap allows "
        f"{CAP / PUSH_S:.0f}/s), peak {subscriber.peak} at once")
    assert subscriber.peak <= CAP
    assert subscriber.peak == CAP  # the cap is used, not only respected
