"""A broker that hangs (SIGSTOP for HANG_S: its connections stay open and its listen backlog
still takes new ones, but no byte answers) costs the receiver nothing in answer time, holds
back no destination on the other broker, and loses nothing: its backlog arrives after it
resumes, and the receiver publishes through it again. A broker that refuses connections is
test_resilience.py's; this is the other fault.

One deployment (tests/integration/test_resilience.py has the details) with a Kafka and a
RabbitMQ destination under a steady load: tansu hangs (the tansu process itself, not the
`TcpGate` in front of it), resumes and the bus catches up; then the RabbitMQ node's Erlang VM
hangs and resumes. The latency bound compares the receiver's answers during a hang with its
answers in the BASELINE_S just before it, in the same run. Run with -s to see the progress.

Found with it: after a hang longer than a Kafka publish's timeout, tansu fenced the receiver's
producer for good and every later Kafka publish went the direct path; the publisher now
replaces a fenced producer (msgbus/brokers/kafka.py; the last test here, on a tansu of its own).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.deployment import Deployment, Phases, Servers
from msgbus_devtools.testkit.load import Answer, SteadyLoad
from msgbus_devtools.testkit.outages import (
    Outage,
    caught_up,
    examples,
    hold,
    latency,
    latency_quantile_s,
    push_delays_s,
    refusals,
    spread,
)
from msgbus_devtools.testkit.procs import BusProcess, RabbitNode, ServerSlot, say
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.brokers.kafka import KafkaPublisher
from msgbus.ids import uuid7
from msgbus.models import BrokerKind, Destination, Envelope

# ~60 s a test on a quiet machine: the hang guard leaves room for a slow one
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(600)]

RATE_PER_S = 250  # messages per second, over both destinations
MAX_LOAD_S = 300  # the load stops by itself after this long (the test stops it sooner)
WARM_PUSHES = 30  # pushes per destination that show the whole path works before a hang
BASELINE_S = 10  # load just before a hang: what the answers during it are compared with
HANG_S = 30
# Shorter than the hang, so that a hang always outlasts a Kafka publish (at the default 30 s
# the two race): messages wait in the buffer until the timeout, then go the direct path, and
# the messages that timed out get the producer fenced. RabbitMQ's confirm timeout is 10 s.
KAFKA_PUBLISH_TIMEOUT_MS = 10_000
RECOVERED_S = 5  # load after a hang's catch-up in which its broker must carry its destination
# the receiver's p99 during a hang may be this many times its p99 before, or this much more
LATENCY_RATIO = 3.0
LATENCY_SLACK_S = 0.05
PERCENTILE = 0.99


@dataclass
class Hang:
    """One broker's hang: the answers before it, and the window it lasted."""

    broker: str
    hung: str  # the destination on the hung broker
    other: str  # the destination on the other broker
    before: tuple[float, float]  # the baseline window (monotonic times)
    outage: Outage
    caught_up_s: float = 0.0  # from the resume until every message accepted so far was pushed
    recovered: BrokerUse | None = None  # how the receiver published `hung` after the catch-up

    def sent_before(self, load: SteadyLoad) -> list[Answer]:
        return _sent_within(load, *self.before)

    def sent_during(self, load: SteadyLoad) -> list[Answer]:
        return _sent_within(load, self.outage.began, self.outage.ended)

    def p99_s(self, load: SteadyLoad) -> tuple[float, float]:
        """The receiver's p99 answer latency before and during the hang."""
        return (latency_quantile_s(self.sent_before(load), PERCENTILE),
                latency_quantile_s(self.sent_during(load), PERCENTILE))

    def too_slow(self, load: SteadyLoad) -> str | None:
        before, during = self.p99_s(load)
        bound = max(LATENCY_RATIO * before, before + LATENCY_SLACK_S)
        if during <= bound:
            return None
        return (f"while {self.broker} hung, the receiver's p99 was {during * 1000:.0f} ms, "
                f"above {bound * 1000:.0f} ms (its p99 before was {before * 1000:.0f} ms)")

    def report(self, deployment: Deployment, load: SteadyLoad) -> str:
        before, during = self.p99_s(load)
        other = deployment.subscribers[self.other]
        hung_during = {a.message_id for a in self.sent_during(load)
                       if a.accepted and a.destination == self.hung}
        pushed = len(hung_during & self.outage.pushed.get(self.hung, set()))
        return (f"{self.broker} hung {self.outage.ended - self.outage.began:.0f} s: receiver "
                f"p99 {before * 1000:.0f} ms before, {during * 1000:.0f} ms during "
                f"({latency(self.sent_during(load))}); {self.other} from 202 to push: "
                f"before {spread(push_delays_s(self.sent_before(load), other))}, during "
                f"{spread(push_delays_s(self.sent_during(load), other))}; {self.hung}: "
                f"{pushed} of {len(hung_during)} pushed before the resume, all caught up "
                f"{self.caught_up_s:.1f} s after it; then {self.recovered}")

    def not_recovered(self) -> str | None:
        """None if, after the catch-up, most of `hung`'s publishes went through its broker."""
        use = self.recovered
        if use is not None and use.through_broker > 0 and use.direct * 2 <= use.through_broker:
            return None
        return f"after {self.broker} resumed and the bus caught up, {use}"


@dataclass
class BrokerUse:
    """How one receiver published one destination in a window: through its broker or, for
    what the broker refused or did not confirm, the direct path."""

    destination: str
    broker: str
    through_broker: float = 0.0
    direct: float = 0.0

    def read(self, receiver: BusProcess) -> tuple[float, float]:
        return (receiver.metric_sum("msgbus_published_total", broker=self.broker, outcome="ok"),
                receiver.metric_sum("msgbus_direct_fallbacks_total",
                                    destination=self.destination, broker=self.broker))

    @classmethod
    def during(cls, receiver: BusProcess, destination: str, broker: str, load: SteadyLoad,
               seconds: float) -> BrokerUse:
        """Over `seconds` of load (one destination per broker: the broker's count is the
        destination's)."""
        use = cls(destination, broker)
        ok_before, direct_before = use.read(receiver)
        hold(load, seconds, f"{broker} back")
        ok_after, direct_after = use.read(receiver)
        use.through_broker, use.direct = ok_after - ok_before, direct_after - direct_before
        return use

    def __str__(self) -> str:
        return (f"in {RECOVERED_S} s the receiver published {self.through_broker:.0f} messages "
                f"of {self.destination} through {self.broker} and {self.direct:.0f} direct")


def _sent_within(load: SteadyLoad, start: float, end: float) -> list[Answer]:
    """Requests sent within [start, end), however long their answers took."""
    return [a for a in load.answers() if start <= a.sent_at < end]


@pytest.fixture
def deployment(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    unique = uuid.uuid4().hex[:6]
    deployed = Deployment(private_servers, tmp_path, {f"k-{unique}": BrokerKind.KAFKA,
                                                      f"r-{unique}": BrokerKind.RABBITMQ})
    deployed.extra_env["MSGBUS_RECEIVER_KAFKA_PUBLISH_TIMEOUT_MS"] = str(KAFKA_PUBLISH_TIMEOUT_MS)
    yield deployed
    deployed.close()


def _hang(deployment: Deployment, load: SteadyLoad, phases: Phases, broker: str,
          server: ServerSlot | RabbitNode) -> Hang:
    """BASELINE_S of load, then `server` paused for HANG_S under load, resumed, the bus caught
    up, and RECOVERED_S more of load."""
    kafka_code, rabbit_code = deployment.destinations
    hung, other = (kafka_code, rabbit_code) if broker == "tansu" else (rabbit_code, kafka_code)
    with phases.phase(f"{BASELINE_S} s of load before {broker} hangs"):
        baseline_from = time.monotonic()
        hold(load, BASELINE_S, "before the hang")
    server.pause()
    try:
        hang = Hang(broker, hung, other, (baseline_from, time.monotonic()),
                    Outage(f"{broker} hung", began=time.monotonic()))
        with phases.phase(f"{broker} hung (SIGSTOP) for {HANG_S} s under load"):
            hold(load, HANG_S, f"{broker} hung")
        hang.outage.end(deployment)
    finally:
        server.resume()
    with phases.phase(f"every message so far pushed after {broker} resumed"):
        resumed = time.monotonic()
        caught_up(deployment, load)
        hang.caught_up_s = time.monotonic() - resumed
    with phases.phase(f"{RECOVERED_S} s of load through {broker} again"):
        hang.recovered = BrokerUse.during(deployment.receivers[0], hung,
                                          deployment.destinations[hung].value, load,
                                          RECOVERED_S)
    return hang


def test_a_hung_broker_holds_back_neither_answers_nor_the_other_broker(
        deployment: Deployment) -> None:
    """Each hang: every POST answered 202 within the receiver's usual p99, the other broker's
    destination flowing all along, and after the resume every accepted message delivered."""
    phases, servers = Phases(), deployment.servers
    with deployment.logs_on_failure():
        with phases.phase("start dispatcher and receiver"):
            deployment.start()
        load = deployment.load(rate_per_s=RATE_PER_S, duration_s=MAX_LOAD_S).start()
        with phases.phase("warm-up"):
            deployment.wait_warm(WARM_PUSHES)
        hangs = [_hang(deployment, load, phases, "tansu", servers.kafka),
                 _hang(deployment, load, phases, "RabbitMQ", servers.rabbit)]
        load.stop()
        load.join()
        say(f"load: {load.summary()}")
        for hang in hangs:
            say(hang.report(deployment, load))
        deployment.check_everything_delivered(load, phases)
        print(phases.report())

        refused = refusals(load.answers())
        assert not refused, (f"{len(refused)} valid messages were refused "
                             f"({dict(load.statuses(refused))}); e.g. {examples(refused)}")
        problems = [problem for hang in hangs for problem in
                    (hang.too_slow(load), hang.outage.held_back(load, hang.other),
                     hang.not_recovered())
                    if problem is not None]
        assert not problems, "; ".join(problems)


# ---- the Kafka publisher across a hang longer than its publish timeout -------------------------

SHORT_PUBLISH_TIMEOUT_MS = 2000
SHORT_HANG_S = 4  # longer than the publish timeout: the messages it caught time out


@pytest.fixture
def own_tansu(tmp_path: Path) -> Iterator[ServerSlot]:
    """A tansu (in memory) of this test's own: the session's is shared with other tests."""
    tansu = ServerSlot(services.start_tansu(services.free_port(), tmp_path))
    yield tansu
    tansu.kill9()


@pytest.fixture
async def publisher(own_tansu: ServerSlot) -> AsyncIterator[KafkaPublisher]:
    kafka = KafkaPublisher(own_tansu.url, publish_timeout_ms=SHORT_PUBLISH_TIMEOUT_MS)
    await kafka.start()
    yield kafka
    await kafka.close()


def _envelopes(destination: Destination, count: int) -> list[Envelope]:
    return [Envelope(uuid7(), destination.code, b"{}", biz_id=f"key-{n % 8}")
            for n in range(count)]


async def _publishes(kafka: KafkaPublisher, destination: Destination) -> bool:
    outcomes = await kafka.publish(destination, _envelopes(destination, 20))
    return all(outcome.ok for outcome in outcomes)


async def test_a_kafka_producer_fenced_after_a_hang_is_replaced(
        own_tansu: ServerSlot, publisher: KafkaPublisher) -> None:
    """The messages a hang longer than the publish timeout catches time out, and librdkafka
    bumps its idempotent producer's epoch, which tansu answers with PRODUCER_FENCED from then
    on: the publisher replaces that producer, and publishes again within a few batches."""
    destination = Destination(code=f"hang-{uuid.uuid4().hex[:6]}", broker=BrokerKind.KAFKA)
    await publisher.ensure_topology(destination, [])
    assert await _publishes(publisher, destination)
    own_tansu.pause()
    try:
        timed_out = await publisher.publish(destination, _envelopes(destination, 20))
        await asyncio.sleep(SHORT_HANG_S - SHORT_PUBLISH_TIMEOUT_MS / 1000)  # the hang's rest
    finally:
        own_tansu.resume()
    assert not any(outcome.ok for outcome in timed_out), "a publish to a hung tansu succeeded"
    await eventually_async(lambda: _publishes(publisher, destination), timeout_s=30,
                           what="a publish that succeeds after tansu resumed", interval_s=0.2)
    assert publisher.replacements == 1, f"{publisher.replacements} producers replaced"
