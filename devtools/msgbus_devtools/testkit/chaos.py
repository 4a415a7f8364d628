"""The chaos run of issue 10, shared by `tests/chaos` and `python -m bench.chaos`.

A bus deployed as separate OS processes (`Deployment`: one receiver, one dispatcher, two
compensators) on private servers (`start_servers`: SecantusDB, tansu on moto's S3, a RabbitMQ
node) carries a steady load sent with the real producer library (`ClientLoad`) to a Kafka and a
RabbitMQ destination with two subscriptions each. During the load, at moments drawn from a
seeded RNG, it kills -9 and restarts the receiver, the dispatcher and a compensator, stops and
restarts tansu, the RabbitMQ node and MongoDB, and makes one subscriber answer 503 for a while.
Every fault is recovered before the load ends (the load runs on until then). Then it waits,
bounded, until every message whose send() returned reached every subscriber (or the time is
up) and accounts for them: delivered, duplicates, lost.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from msgbus.models import BrokerKind
from msgbus_devtools.servers import ServiceError
from msgbus_devtools.testkit import accounting
from msgbus_devtools.testkit.chaos_result import ChaosConfig, ChaosResult, attribute_duplicates
from msgbus_devtools.testkit.client_load import ClientLoad
from msgbus_devtools.testkit.deployment import SUBSCRIPTION, Deployment, Phases, Servers
from msgbus_devtools.testkit.faults import FaultKind, FaultPlan, FaultRunner, PlannedFault
from msgbus_devtools.testkit.procs import BusProcess, say
from msgbus_devtools.testkit.waiting import NotInTime, Steady, eventually

__all__ = ["ChaosConfig", "ChaosResult", "run_chaos"]

SUBSCRIPTIONS = (SUBSCRIPTION, "audit")  # two per destination: "delivered to every subscriber"
WARM_PUSHES = 10  # per subscription, before the first fault
RECORDED_EVERY_S = 5.0  # how often the accounting reads every delivered id
MAX_FAULT_OVERRUN_S = 120.0  # the load runs on this long at most, while faults are not over
SETTLE_S = 3.0  # after the last delivery: no push for this long means no duplicate is on its way
RESTART_DELAY_S = 1.0
FAILING_STATUS = 503

# down times suit a window of ~45 s; longer runs repeat the set of faults (see `rounds`)
FAULT_KINDS = [
    FaultKind("receiver", "kill -9 the receiver", (0.5, 3.0), 6.0),
    FaultKind("dispatcher", "kill -9 the dispatcher", (1.0, 4.0), 6.0),
    FaultKind("compensator", "kill -9 a compensator", (1.0, 5.0), 6.0),
    FaultKind("kafka", "stop tansu", (3.0, 10.0), 4.0),
    FaultKind("rabbitmq", "stop the RabbitMQ node", (3.0, 10.0), 15.0),
    FaultKind("mongodb", "stop MongoDB", (4.0, 12.0), 4.0),
    FaultKind("subscriber", f"a subscriber answers {FAILING_STATUS}", (4.0, 12.0), 0.0),
]


# ---- faults ----------------------------------------------------------------------------------


class ChaosActions:
    """What each fault kind does to the deployment, and how it recovers."""

    def __init__(self, deployment: Deployment, compensators: list[BusProcess]) -> None:
        self.deployment = deployment
        self.servers: Servers = deployment.servers
        self.compensators = compensators

    def table(self) -> dict[str, tuple[Any, Any]]:
        d, s = self.deployment, self.servers
        receiver, dispatcher = d.receivers[0], d.dispatcher
        assert dispatcher is not None
        return {
            "receiver": (lambda _: receiver.kill9(), lambda _: restart(receiver)),
            "dispatcher": (lambda _: dispatcher.kill9(), lambda _: restart(dispatcher)),
            "compensator": (lambda f: self._compensator(f).kill9(),
                            lambda f: restart(self._compensator(f))),
            "kafka": (lambda _: s.stop_kafka(), lambda _: s.start_kafka()),
            "rabbitmq": (lambda _: s.rabbit.stop(), lambda _: s.rabbit.start()),
            "mongodb": (lambda _: s.mongo.stop(), lambda _: s.mongo.start()),
            "subscriber": (lambda f: self._answer(f, FAILING_STATUS),
                           lambda f: self._answer(f, 200)),
        }

    def _compensator(self, fault: PlannedFault) -> BusProcess:
        return next(c for c in self.compensators if c.name == fault.target)

    def _answer(self, fault: PlannedFault, status: int) -> None:
        self.deployment.subscriber_of[fault.target].status = status


def restart(process: BusProcess, timeout_s: float = 120.0) -> None:
    """Start `process` again, as a supervisor (Kubernetes) would: a service that cannot start
    yet is started again. The compensator needs MongoDB to start; the dispatcher does not (it
    starts from the configuration snapshot it saved, `msgbus/registry.py` `_load_snapshot`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            process.start()
            return
        except ServiceError as exc:
            if time.monotonic() > deadline:
                raise
            say(f"{process.name} did not start ({str(exc).splitlines()[0]}); "
                f"starting it again in {RESTART_DELAY_S:.0f} s")
            time.sleep(RESTART_DELAY_S)


def draw_plan(config: ChaosConfig, deployment: Deployment,
              compensators: list[BusProcess]) -> FaultPlan:
    """`config.rounds` rounds of one fault of each kind, each round in its own part of the
    window."""
    targets = {"compensator": [c.name for c in compensators],
               "subscriber": deployment.subscription_ids()}
    round_s = config.window_s / config.rounds
    faults: list[PlannedFault] = []
    for index in range(config.rounds):
        part = FaultPlan.draw(config.seed * 1000 + index, round_s, FAULT_KINDS, targets)
        faults += [PlannedFault(f.kind, round(f.start_s + index * round_s, 1), f.down_s,
                                f.target) for f in part.faults]
    return FaultPlan(config.seed, config.window_s, sorted(faults, key=lambda f: f.start_s))


# ---- the run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def deployed(servers: Servers, work_dir: Path, config: ChaosConfig) -> Iterator[Deployment]:
    servers.restart_stopped()
    unique = uuid.uuid4().hex[:6]
    deployment = Deployment(servers, work_dir, {f"chaos-k-{unique}": BrokerKind.KAFKA,
                                                f"chaos-r-{unique}": BrokerKind.RABBITMQ},
                            subscription_names=SUBSCRIPTIONS)
    # The in-flight budget bounds what a dispatcher killed with -9 has taken from the broker and
    # not yet recorded: all of it is pushed again after its restart (the product's default is
    # max(64, 4 x max_concurrency); 0 here keeps that default).
    deployment.subscription_options = {
        "max_concurrency": 16, "timeout_ms": 2000,
        "retry_policy": {"delays_s": list(config.retry_delays_s)},
        "max_in_flight": config.max_in_flight or None}
    deployment.compensator_settings = {
        "scan_interval_s": "0.5", "lease_s": str(config.lease_s),
        "sweep_after_s": str(config.sweep_after_s), "sweep_interval_s": "2"}
    # below the sweep threshold, as the product's defaults are: a backlog older than this may
    # have been swept, so the dispatcher looks it up before pushing
    deployment.extra_env["MSGBUS_DISPATCHER_CHECK_DELIVERED_AFTER_S"] = str(
        config.sweep_after_s / 2)
    try:
        yield deployment
    finally:
        deployment.close()


def run_chaos(servers: Servers, work_dir: Path, config: ChaosConfig) -> ChaosResult:
    phases = Phases()
    work_dir.mkdir(parents=True, exist_ok=True)
    with deployed(servers, work_dir, config) as deployment, deployment.logs_on_failure():
        with phases.phase("start receiver, dispatcher and two compensators"):
            deployment.start()
            second = deployment.add_compensator("compensator-b",
                                                **deployment.compensator_settings)
            second.start()
        compensators = [deployment.compensator, second]
        plan = draw_plan(config, deployment, compensators)
        say(plan.describe())
        load = ClientLoad(deployment.receivers[0].url, deployment.api_key,
                          work_dir / "client-spool", list(deployment.destinations),
                          rate_per_s=config.rate_per_s,
                          duration_s=config.duration_s + MAX_FAULT_OVERRUN_S).start()
        try:
            with phases.phase("warm-up"):
                deployment.wait_warm(WARM_PUSHES)
            runner = _run_faults(deployment, compensators, plan, load, config, phases)
            with phases.phase("the rest of the load"):
                _watch(load, runner, lambda: load_ended(load), load.duration_s,
                       "the load to end")
                load.join()
            say(f"load: {load.summary()}")
            quiet_after = _wait_quiet(deployment, load, config, phases)
        finally:
            load.stop()
            spooled = load.close()
        return _result(deployment, load, config, plan, runner, phases, quiet_after, spooled)


def load_ended(load: ClientLoad) -> bool:
    return time.monotonic() - load.started_at >= load.duration_s


def _run_faults(deployment: Deployment, compensators: list[BusProcess], plan: FaultPlan,
                load: ClientLoad, config: ChaosConfig, phases: Phases) -> FaultRunner:
    # the fault window starts lead_s after the load did, or at the end of a longer warm-up
    time.sleep(max(0.0, load.started_at + config.lead_s - time.monotonic()))
    runner = FaultRunner(plan, ChaosActions(deployment, compensators).table(), say=say)
    with phases.phase(f"faults ({len(plan.faults)}) under load"):
        runner.start()
        _watch(load, runner, runner.done, plan.window_s + MAX_FAULT_OVERRUN_S,
               "every fault to be over")
        runner.join(30)
    # the load goes on for tail_s after the last fault, however late that was
    load.end_after(max(config.duration_s, time.monotonic() - load.started_at + config.tail_s))
    return runner


def _watch(load: ClientLoad, runner: FaultRunner, until: Callable[[], bool],
           timeout_s: float, what: str) -> None:
    """Wait until `until()`, printing the load and the faults under way; fail after
    `timeout_s`."""
    def progress() -> str:
        active = runner.active()
        return (f"t={runner.now_s():.0f} s: {load.summary()}; "
                f"down: {', '.join(active) if active else 'nothing'}")

    eventually(until, timeout_s, what, interval_s=0.2, progress=progress)


def _wait_quiet(deployment: Deployment, load: ClientLoad, config: ChaosConfig,
                phases: Phases) -> float:
    """Wait (bounded) until the spool is empty and every sent message reached every
    subscriber, then until no push came for SETTLE_S; returns how long the first took."""
    began = time.monotonic()
    expected = {sub: load.sent_ids(sub.split("/", 1)[0])
                for sub in deployment.subscription_ids()}
    need = sum(map(len, expected.values()))

    def delivered() -> int:
        return sum(len(ids & deployment.subscriber_of[sub].successes().keys())
                   for sub, ids in expected.items())

    with phases.phase(f"wait until {need} deliveries arrived (at most "
                      f"{config.quiet_timeout_s:.0f} s)"):
        have = 0

        def quiet() -> bool:
            nonlocal have
            have = delivered()
            return have >= need and not load.spooled()

        try:
            eventually(quiet, config.quiet_timeout_s, f"{need} deliveries, the spool empty",
                       interval_s=0.5, progress=lambda: (
                           f"{have} of {need} deliveries, {load.spooled()} in the spool; "
                           f"{backlogs(deployment)}"))
        except NotInTime:  # bounded, not a failure: the accounting says what is missing
            say(f"  gave up waiting: {have} of {need} deliveries, "
                f"{load.spooled()} in the spool; {backlogs(deployment, states=True)}")
            deployment.print_state()
    quiet_after = time.monotonic() - began
    with phases.phase(f"settle: no push for {SETTLE_S:.0f} s"):
        _settle(deployment)
    return quiet_after


def backlogs(deployment: Deployment, *, states: bool = False) -> str:
    """Where work waits: receiver buffers, the dispatcher's outcome buffer and, with
    `states`, the delivery states in MongoDB (a scan of every delivery: SecantusDB serves one
    query at a time, so never in a progress line, whose polling would slow the bus)."""
    parts = []
    for receiver in deployment.receivers:
        health = receiver.health(timeout_s=2.0)
        parts.append(f"{receiver.name} buffer "
                     f"{health.get('buffer') if health else 'down'}")
    if deployment.dispatcher is not None:
        health = deployment.dispatcher.health(timeout_s=2.0)
        parts.append(f"dispatcher outcomes {health.get('trace_backlog') if health else 'down'}")

    async def by_state() -> dict[str, int]:
        pipeline = [{"$group": {"_id": "$status", "n": {"$sum": 1}}}]
        return {str(d["_id"]): int(d["n"])
                async for d in await deployment.store.db.deliveries.aggregate(pipeline)}

    if states:
        try:
            parts.append(f"deliveries in MongoDB {deployment.run(by_state(), timeout_s=30)}")
        except Exception as exc:  # MongoDB slow or down: the line says so
            parts.append(f"deliveries in MongoDB: {type(exc).__name__}")
    return "; ".join(parts)


def _settle(deployment: Deployment, timeout_s: float = 30.0) -> None:
    """Until no push came for SETTLE_S (bounded: pushes that go on are counted as they are)."""
    pushes = Steady(lambda: sum(len(s.pushes) for s in deployment.subscriber_of.values()),
                    SETTLE_S)
    try:
        eventually(pushes, timeout_s, f"no push for {SETTLE_S:.0f} s", interval_s=SETTLE_S,
                   patient=False)
    except NotInTime:
        say(f"  pushes still coming after {timeout_s:.0f} s ({pushes.last} so far)")


def _recorded(deployment: Deployment, accounts: list[accounting.SubscriptionAccount],
              expected: dict[str, set[str]], timeout_s: float) -> None:
    """How many expected messages MongoDB marks delivered (waits, bounded, for the trace:
    outcomes reach MongoDB through the dispatcher's and compensators' local buffers)."""
    have = need = 0

    def all_recorded() -> bool:
        nonlocal have, need
        for acc in accounts:
            acc.recorded_delivered = len(expected[acc.subscription]
                                         & deployment.delivered_ids(acc.subscription))
        have = sum(a.recorded_delivered or 0 for a in accounts)
        need = sum(a.delivered for a in accounts)
        return have >= need

    # bounded, not a failure: the accounts hold what was recorded by then
    with contextlib.suppress(NotInTime):
        eventually(all_recorded, timeout_s, "every delivery marked delivered in MongoDB",
                   interval_s=RECORDED_EVERY_S,
                   progress=lambda: f"{have} of {need}; {backlogs(deployment)}")


def _result(deployment: Deployment, load: ClientLoad, config: ChaosConfig, plan: FaultPlan,
            runner: FaultRunner, phases: Phases, quiet_after: float,
            spooled: int) -> ChaosResult:
    expected = {sub: load.sent_ids(sub.split("/", 1)[0])
                for sub in deployment.subscription_ids()}
    accounts = [accounting.account(sub, ids, deployment.subscriber_of[sub])
                for sub, ids in expected.items()]
    with phases.phase(f"MongoDB marks them delivered (at most {config.record_timeout_s:.0f} s)"):
        _recorded(deployment, accounts, expected, config.record_timeout_s)
    total = accounting.totals(len(load.sent()), accounts)
    after, timeline = attribute_duplicates(runner, accounts)
    lost: set[str] = set().union(*(a.lost_ids for a in accounts))
    problems = [f"{run.planned.kind.name}: {run.error}" for run in runner.runs if run.error]
    if spooled:
        problems.append(f"{spooled} messages stayed in the client's spool")
    return ChaosResult(
        config=config, plan=plan, accounts=accounts, totals=total,
        faults=[run.as_json() for run in runner.runs], load_s=load.elapsed_s(),
        quiet_after_s=quiet_after, send_errors=dict(load.errors()), spooled_at_end=spooled,
        brokers={code: kind.value for code, kind in deployment.destinations.items()},
        phases=phases, lost_examples=deployment.describe(lost, limit=10) if lost else "",
        problems=problems, duplicates_after=after, duplicate_timeline=timeline)
