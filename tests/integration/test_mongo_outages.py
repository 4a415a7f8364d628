"""Delivery keeps its pace while MongoDB hangs, dies or is cut off (issue 37).

Two receivers, two dispatchers and a compensator run as separate OS processes against private
servers; every bus process reaches MongoDB through a `TcpGate`. Under a steady load through a
Kafka and a RabbitMQ destination, MongoDB is taken away three times, 30 s each (a load of its
own each time, stopped when MongoDB is back: the development stand-in writes the bus's records
at about three times this rate, so a 30 s backlog is caught up only without more load):

- hung: the SecantusDB process stopped with SIGSTOP (connections stay open, nothing answers);
- killed: kill -9, started again on the same storage afterwards (connections refused);
- cut off: the gate freezes every connection (as a network that drops packets).

For each: the pushes made during the fault keep up with what was accepted meanwhile (at least
MIN_PACE of it), and the median time from a 202 to the push is at most MAX_LATENCY_RATIO times
the median just before. Every process's /health shows its MongoDB gate closed during the
fault. After the measured 30 s of the kill, while MongoDB is still down, a dispatcher is killed
with -9 and starts again from the configuration it saved. Afterwards every accepted message is
recorded in MongoDB, pushed and marked delivered. The load never re-sends, so a message pushed
twice comes only from the killed dispatcher: what it had in flight and not yet committed, which
no process can look up while MongoDB is down (at most MAX_TWICE per destination).
Run with -s to see the progress and the figures.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from msgbus_devtools.testkit.deployment import Deployment, Phases, Servers
from msgbus_devtools.testkit.load import Answer, SteadyLoad
from msgbus_devtools.testkit.outages import hold, push_delays_s
from msgbus_devtools.testkit.procs import BusProcess, say
from msgbus_devtools.testkit.waiting import eventually

from msgbus.models import BrokerKind

# ~190 s on a quiet machine; the global 300 s hang guard is too short on a slow one (each
# catch-up after a fault is paced by the stand-in MongoDB)
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(900)]

RATE_PER_S = 500  # over both destinations and both receivers
WARM_PUSHES = 50
BEFORE_S = 6  # the window whose median latency each fault is compared with
FAULT_S = 30
MIN_PACE = 0.9  # pushes during a fault / messages accepted during it, per destination
MAX_LATENCY_RATIO = 2.0
GATE_CLOSED_WITHIN_S = 10  # every process sees MongoDB unavailable within this (it pays 1 timeout)
# a dispatcher's in-flight budget for these subscriptions (max(64, 4 * max_concurrency 32)) and
# as many Kafka offsets handed out but not yet committed (every 0.5 s)
MAX_TWICE = 2 * 128


@dataclass
class Fault:
    name: str
    begin: Callable[[], object]
    end: Callable[[], object]
    after_window: Callable[[], object] | None = None  # still during the fault, not measured


def _restart_while_mongo_is_down(dispatcher: BusProcess) -> None:
    """kill -9 and start again: it serves the configuration it saved, and pushes."""
    dispatcher.kill9()
    dispatcher.start()
    health = dispatcher.health()
    assert health is not None and health["subscriptions"], health
    assert not health["mongo_gate"]["available"], health["mongo_gate"]


def _faults(servers: Servers, dispatcher: BusProcess) -> list[Fault]:
    mongo, gate = servers.mongo, servers.mongo_gate
    return [Fault("hung (SIGSTOP)", mongo.pause, mongo.resume),
            Fault("killed (-9)", mongo.kill9, mongo.start,
                  functools.partial(_restart_while_mongo_is_down, dispatcher)),
            Fault("cut off (packets dropped)", gate.freeze, gate.thaw)]


@dataclass
class Window:
    """What the load and the subscribers did between two moments (monotonic)."""

    began: float
    ended: float

    def accepted(self, load: SteadyLoad, code: str) -> list[Answer]:
        """The 202s of the messages sent to `code` within the window."""
        return [a for a in load.answered_within(self.began, self.ended)
                if a.accepted and a.destination == code]

    def pushed(self, deployment: Deployment, code: str) -> set[str]:
        return {p.message_id for p in deployment.subscribers[code].pushes
                if self.began <= p.at <= self.ended}


def _median_latency_ms(deployment: Deployment, load: SteadyLoad, window: Window,
                       code: str) -> float:
    """Median of (first push - 202) over the messages accepted in the window; one never
    pushed counts as infinitely late."""
    delays = push_delays_s(window.accepted(load, code), deployment.subscribers[code],
                           unpushed_s=math.inf)
    assert delays, f"nothing of {code} was accepted within the window"
    return statistics.median(delays) * 1000


def _gates(processes: list[BusProcess]) -> dict[str, bool | None]:
    """Each process's view of MongoDB: its gate open (True), closed (False) or no answer."""
    views: dict[str, bool | None] = {}
    for process in processes:
        health = process.health(timeout_s=3.0)
        views[process.name] = None if health is None else health["mongo_gate"]["available"]
    return views


def _wait_gates(processes: list[BusProcess], available: bool, timeout_s: float) -> None:
    eventually(lambda: set(_gates(processes).values()) == {available}, timeout_s,
               f"every bus process to see MongoDB {'back' if available else 'unavailable'}",
               interval_s=0.5)


def _waiting_for_mongo(process: BusProcess) -> int:
    """Records (receiver) or outcomes (dispatcher) still in the process's local buffer."""
    health = process.health(timeout_s=3.0) or {}
    if process.service == "receiver":
        return int(health.get("buffer", {}).get("record", 1))
    return int(health.get("trace_backlog", 1))


def _wait_caught_up(processes: list[BusProcess], timeout_s: float) -> None:
    """Every record and outcome buffered during the outage is in MongoDB: the next fault's
    "before" is measured on a bus at rest, not one catching up."""
    eventually(lambda: not any(_waiting_for_mongo(p) for p in processes), timeout_s,
               "the local buffers to be written to MongoDB", interval_s=0.5)


def _kafka_assigned(process: BusProcess, code: str) -> bool:
    return f"kafka consumer msgbus.{code}.rec assigned" in process.log_path.read_text()


@pytest.fixture
def deployment(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    unique = uuid.uuid4().hex[:6]
    deployed = Deployment(private_servers, tmp_path, {f"k-{unique}": BrokerKind.KAFKA,
                                                      f"r-{unique}": BrokerKind.RABBITMQ},
                          mongo_through_gate=True)
    yield deployed
    deployed.close()


@dataclass
class Figures:
    fault: str
    code: str
    accepted: int
    pushed: int
    before_p50_ms: float
    during_p50_ms: float

    @property
    def pace(self) -> float:
        return self.pushed / max(1, self.accepted)

    @property
    def latency_ratio(self) -> float:
        return self.during_p50_ms / max(self.before_p50_ms, 1.0)

    def __str__(self) -> str:
        return (f"{self.fault}, {self.code}: {self.pushed} pushed of {self.accepted} accepted "
                f"during it (pace {self.pace:.2f}); p50 202->push {self.before_p50_ms:.0f} ms "
                f"before, {self.during_p50_ms:.0f} ms during (x{self.latency_ratio:.2f})")


def _run_fault(deployment: Deployment, loads: list[SteadyLoad], phases: Phases, fault: Fault,
               bus: list[BusProcess]) -> list[Figures]:
    load = deployment.load(rate_per_s=RATE_PER_S, duration_s=3 * (BEFORE_S + FAULT_S)).start()
    loads.append(load)
    with phases.phase(f"load for {BEFORE_S} s before MongoDB is {fault.name}"):
        before = Window(time.monotonic(), 0.0)
        hold(load, BEFORE_S, "before")
        before.ended = time.monotonic()
    during = Window(time.monotonic(), 0.0)
    fault.begin()
    try:
        with phases.phase(f"MongoDB {fault.name} for {FAULT_S} s under load"):
            _wait_gates(bus, available=False, timeout_s=GATE_CLOSED_WITHIN_S)
            hold(load, during.began + FAULT_S - time.monotonic(), f"MongoDB {fault.name}")
            during.ended = time.monotonic()
        if fault.after_window is not None:
            with phases.phase(f"a dispatcher killed (-9) and started while MongoDB is "
                              f"{fault.name}"):
                fault.after_window()
    finally:
        fault.end()
        load.stop()
    figures = [Figures(fault.name, code, len(during.accepted(load, code)),
                       len(during.pushed(deployment, code)),
                       _median_latency_ms(deployment, load, before, code),
                       _median_latency_ms(deployment, load, during, code))
               for code in deployment.destinations]
    for line in figures:
        say(str(line))
    with phases.phase(f"every process sees MongoDB back after it was {fault.name}"):
        _wait_gates(bus, available=True, timeout_s=60)
    load.join()
    with phases.phase("records and outcomes buffered meanwhile written to MongoDB"):
        _wait_caught_up(bus, timeout_s=120)
    return figures


def test_delivery_keeps_its_pace_while_mongodb_hangs_dies_or_is_cut_off(
        deployment: Deployment) -> None:
    phases = Phases()
    with deployment.logs_on_failure():
        with phases.phase("start 2 receivers, 2 dispatchers and a compensator"):
            deployment.start(receivers=2)
            second = deployment.add_dispatcher("dispatcher-2")
            second.start()
        kafka_code = next(c for c, b in deployment.destinations.items() if b is BrokerKind.KAFKA)
        with phases.phase("the Kafka group rebalanced over both dispatchers"):
            eventually(lambda: _kafka_assigned(second, kafka_code), 60,
                       "dispatcher-2 to be assigned Kafka partitions", interval_s=0.2)
        bus = [p for p in deployment.processes if p.service in ("receiver", "dispatcher")]
        warm = deployment.load(rate_per_s=RATE_PER_S, messages=RATE_PER_S)
        with phases.phase("warm-up"):
            warm.start()
            deployment.wait_warm(WARM_PUSHES)
            warm.join()
        loads = [warm]
        figures = [f for fault in _faults(deployment.servers, second)
                   for f in _run_fault(deployment, loads, phases, fault, bus)]
        for load in loads:
            deployment.check_everything_delivered(load, phases)
        print(phases.report())
        print("\n".join(map(str, figures)))

    refused = [a for load in loads for a in load.answers() if not a.accepted]
    assert not refused, f"{len(refused)} messages were refused, e.g. {refused[:3]}"
    slow = [f for f in figures if f.pace < MIN_PACE or f.latency_ratio > MAX_LATENCY_RATIO]
    assert not slow, "delivery slowed down while MongoDB was away:\n" + "\n".join(map(str, slow))
    twice = {code: sum(deployment.subscribers[code].successes().values())
             - len(deployment.subscribers[code].successes()) for code in deployment.destinations}
    assert max(twice.values()) <= MAX_TWICE, f"messages pushed twice: {twice}"
