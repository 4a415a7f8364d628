"""The lateness phase of `python -m bench.delays` (its doc says what is measured): the whole bus
(`DispatchStack(full=True)`, as bench.e2e), one destination per broker, each with one
subscription to a `RecordingSubscriber` served in this process, and `MsgbusClient` sending
delayed messages. Lateness per message comes from `msgbus_devtools.testkit.delays`."""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from msgbus_client import MsgbusClient
from msgbus_devtools.testkit.delays import lateness_s
from msgbus_devtools.testkit.loop import BackgroundLoop
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import NotInTime, eventually

from bench import cli
from bench.dispatch_stack import HOST, DispatchStack
from bench.pipeline import SUBSCRIPTION, delete_rabbitmq_topology
from bench.report import cell, say, spread
from msgbus.models import BrokerKind
from msgbus.percentiles import nearest_rank
from msgbus.serving import ServerGroup, make_server

BROKERS = ("kafka", "rabbitmq", "direct")
PUSH_CONCURRENCY = 32
PUSH_TIMEOUT_MS = 5000
GROUP_COMMIT_MS = 2.0
START_TIMEOUT_S = 60.0


@dataclass
class BrokerLateness:
    broker: str
    sent: int
    lateness_s: list[float]  # per message pushed: its first push's arrival - its due time
    pushes: int  # every push of these messages, duplicates included

    @property
    def early(self) -> int:
        return sum(1 for s in self.lateness_s if s < 0)

    @property
    def missing(self) -> int:
        return self.sent - len(self.lateness_s)

    @property
    def duplicates(self) -> int:
        return self.pushes - len(self.lateness_s)

    def figures(self) -> dict[str, float]:
        return {"p50_s": nearest_rank(self.lateness_s, 0.5),  # nan when none was pushed
                "p99_s": nearest_rank(self.lateness_s, 0.99),
                "max_s": max(self.lateness_s, default=math.nan)}


@dataclass
class LatenessRun:
    run: int
    send_s: float  # how long the client took to send them all
    left_in_spool: int
    brokers: dict[str, BrokerLateness] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"run {self.run}  {b.broker:<8} {len(b.lateness_s):,}/{b.sent:,} pushed; "
                f"lateness p50 {nearest_rank(b.lateness_s, 0.5):.3f} s, "
                f"p99 {nearest_rank(b.lateness_s, 0.99):.3f} s, "
                f"max {b.figures()['max_s']:.3f} s; {b.early} early, {b.duplicates} duplicates"
                for b in self.brokers.values()] + [
            f"run {self.run}  sent in {self.send_s:.1f} s, {self.left_in_spool} left in the "
            "client's spool"]

    def problems(self) -> list[str]:
        found = [f"run {self.run} {b.broker}: {count} {what}"
                 for b in self.brokers.values()
                 for count, what in ((b.early, "pushed before their time"),
                                     (b.missing, "never pushed")) if count]
        if self.left_in_spool:
            found.append(f"run {self.run}: {self.left_in_spool} never left the client's spool")
        return found


class LatenessBench:
    def __init__(self, args: argparse.Namespace, workdir: Path,
                 exits: contextlib.ExitStack) -> None:
        self.args = args
        self.workdir = workdir
        self.stack = DispatchStack(workdir, exits, full=True)
        self.loop = BackgroundLoop()
        exits.callback(self.loop.close)
        self.servers = ServerGroup()
        exits.callback(lambda: self.loop.run(self.servers.stop()))
        self.subscribers: dict[str, RecordingSubscriber] = {}
        self.codes: dict[str, str] = {}
        self.exits = exits

    def start(self) -> None:
        self.stack.start()
        sub_ids: list[str] = []
        for broker in BROKERS:
            self.subscribers[broker] = RecordingSubscriber()
            self.codes[broker] = f"delays-{broker}-{self.stack.run_id}"
            sub_ids += self.stack.create(
                self.codes[broker], {SUBSCRIPTION: self._serve(self.subscribers[broker])},
                concurrency=PUSH_CONCURRENCY, timeout_ms=PUSH_TIMEOUT_MS,
                broker=BrokerKind(broker))
        self.exits.callback(delete_rabbitmq_topology, self.stack.env["MSGBUS_RABBITMQ_URL"],
                            [self.codes["rabbitmq"]])
        self.stack.set_paused(sub_ids, False)
        # a RabbitMQ queue exists once its worker runs (e2e.py says why that matters)
        eventually(lambda: set(sub_ids) <= self.stack.running_workers(), START_TIMEOUT_S,
                   "the dispatcher's workers", interval_s=0.2)
        self._warm_up()

    def _serve(self, subscriber: RecordingSubscriber) -> str:
        server = self.loop.run(self.servers.start(make_server(subscriber, HOST, 0), "subscriber"))
        return f"http://{HOST}:{server.port}/hook"

    def _client(self, name: str) -> MsgbusClient:
        return MsgbusClient(self.stack.receiver_url, self.stack.api_key,
                            spool_dir=self.workdir / "spools" / name,
                            group_commit_ms=GROUP_COMMIT_MS)

    def _warm_up(self) -> None:
        """A new Kafka consumer group takes seconds to join: that would count as lateness of
        the shortest delays."""
        client = self._client("warm-up")
        try:
            for broker, code in self.codes.items():
                self._wait_for_push(broker, client.send(code, {"warm": True}))
        finally:
            client.close(30)

    def _wait_for_push(self, broker: str, message_id: str) -> None:
        subscriber = self.subscribers[broker]
        eventually(lambda: message_id in subscriber.message_ids(), START_TIMEOUT_S,
                   f"{broker} warm-up", interval_s=0.1)

    def run_once(self, run: int) -> LatenessRun:
        rng = random.Random(run)  # the same delays in every invocation
        due: dict[str, dict[str, datetime]] = {broker: {} for broker in BROKERS}
        client = self._client(f"run-{run}")
        began = time.monotonic()
        try:
            for n in range(self.args.messages):  # interleaved: every broker's wait at once
                for broker, code in self.codes.items():
                    at = datetime.now(UTC) + timedelta(seconds=rng.uniform(0,
                                                                           self.args.max_delay_s))
                    due[broker][client.send(code, {"n": n, "run": run}, deliver_at=at)] = at
            send_s = time.monotonic() - began
        finally:
            left = client.close(30)
        self._wait_pushed(run, due)
        result = LatenessRun(run, send_s, left)
        for broker, subscriber in self.subscribers.items():
            pushes = [p for p in list(subscriber.pushes) if p.message_id in due[broker]]
            result.brokers[broker] = BrokerLateness(
                broker, len(due[broker]), list(lateness_s(pushes, due[broker]).values()),
                len(pushes))
        return result

    def _wait_pushed(self, run: int, due: dict[str, dict[str, datetime]]) -> None:
        def pushed() -> int:
            self.stack.check_alive()
            return sum(len(self.subscribers[b].message_ids() & due[b].keys()) for b in BROKERS)

        expected = sum(len(d) for d in due.values())
        last_due = max(at for d in due.values() for at in d.values())
        timeout_s = (last_due - datetime.now(UTC)).total_seconds() + self.args.timeout
        with contextlib.suppress(NotInTime):  # what is missing is reported
            eventually(lambda: pushed() >= expected, timeout_s, f"run {run} pushes",
                       interval_s=0.25, progress=lambda: f"{pushed():,}/{expected:,} pushed")


def lateness_runs(args: argparse.Namespace, workdir: Path,
                  exits: contextlib.ExitStack) -> list[LatenessRun]:
    bench = LatenessBench(args, workdir, exits)
    bench.start()
    say("bus started and warm; lateness runs begin")
    return cli.each_run(bench.run_once, args.runs)


def _spreads(runs: list[LatenessRun], broker: str) -> dict[str, dict[str, float]]:
    per_run = [r.brokers[broker].figures() for r in runs]
    return {key: spread([f[key] for f in per_run]) for key in per_run[0]}


def lateness_lines(runs: list[LatenessRun]) -> list[str]:
    """The table: per broker, min / median / max over the runs of p50, p99 and max lateness."""
    lines = [f"lateness (s), min / median / max of {len(runs)} run(s):"]
    for broker in BROKERS:
        s = _spreads(runs, broker)
        totals = {what: sum(getattr(r.brokers[broker], what) for r in runs)
                  for what in ("early", "missing", "duplicates")}
        lines.append(f"  {broker:<8} p50 {cell(s['p50_s'], '.3f')}   p99 "
                     f"{cell(s['p99_s'], '.3f')}   max {cell(s['max_s'], '.3f')}   "
                     + ", ".join(f"{count} {what}" for what, count in totals.items()))
    return lines


def lateness_json(runs: list[LatenessRun]) -> tuple[dict[str, Any], list[str]]:
    """The lateness figures for the JSON line, and the problems of every run."""
    figures = {broker: _spreads(runs, broker) | {
        what: sum(getattr(r.brokers[broker], what) for r in runs)
        for what in ("early", "missing", "duplicates")} for broker in BROKERS}
    figures["send_s"] = spread([r.send_s for r in runs])
    return figures, [p for r in runs for p in r.problems()]
