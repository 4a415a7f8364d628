"""Whole-system benchmark (issue 10): the producer library's send() → receiver → Kafka |
RabbitMQ → dispatcher → subscriber, with MongoDB records and a compensator running, every
service in a process of its own, against a direct HTTP call measured in the same run.

    python -m bench.e2e [--runs 3] [--rate 5000] [--duration-s 15] [--latency-s 10]
                        [--brokers kafka,rabbitmq] [--quick] [--plot PATH]

Starts (bench/dispatch_stack.py, `full=True`) tansu and SecantusDB on free ports, uses the
machine's RabbitMQ, and runs `msgbus receiver`, `msgbus dispatcher` and `msgbus compensator`
(the production entry points), two subscriber processes (bench/dispatch_subscriber.py) and a
load process (bench/e2e_load.py); all are stopped by PID at the end, also on Ctrl-C, SIGTERM
or an error. Per run:

1. saturation, per broker: `MsgbusClient.send()` from 16 threads (LMDB spool, group commit,
   batched resends) at `--rate` msg/s for `--duration-s` to a destination with one healthy
   subscription. send/s = sends ÷ their time; accepted/s = sends ÷ (time until the client's
   spool is empty, every message answered 202); delivered/s = sends ÷ (last arrival at the
   subscriber - first send). CPU cores of every process = its CPU seconds ÷ wall seconds.
2. latency at half of this run's Kafka delivered/s, for `--latency-s`: latency = arrival at the
   subscriber - the moment send() returned (one machine, one clock). Then the baseline: the
   same bodies POSTed straight to the subscriber at the same rate; latency = arrival - POST
   start. overhead p50 = bus p50 - direct p50. With `--mongo-stopped-phase`, the same load
   again with the MongoDB server stopped (SIGSTOP): `mongo_stopped_overhead_ratio` = that
   overhead p50 ÷ the overhead with MongoDB running, same run (goal ≤ 1: a hung MongoDB costs
   each process one short wait, and its records wait in the local buffers).
3. isolation (as bench.dispatch): a healthy subscriber A works off a backlog alone, then beside B
   (never answers: 1 s timeouts), C (500 at once) and D (300 ms per request) on one destination;
   ratio = A's rate with them ÷ alone. The compensator retries B's and C's failures meanwhile.

Progress goes to stderr; per-run lines, a min/median/max table, the goals, the plot's path and,
as the last line, one JSON object (`e2e_msgs_per_s`, `overhead_p50_ms`, `isolation_ratio`, ...)
go to stdout. Problems (messages lost or never sent) make the exit code 1; missed goals do not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from msgbus_devtools.testkit.waiting import NotInTime, eventually

from bench import cli, e2e_load
from bench.dispatch import DispatchBench
from bench.dispatch_report import RunFigures
from bench.dispatch_stack import DispatchStack
from bench.e2e_report import (
    Capacity,
    E2ERun,
    cpu_summary,
    goals,
    plot,
    summarize,
    table,
)
from bench.report import out, out_json, out_lines, say
from msgbus.models import BrokerKind
from msgbus.percentiles import nearest_rank

CLIENT_THREADS = 16
DIRECT_CONCURRENCY = 64
LATENCY_BASE_N = 1_000_000  # message numbers of the latency phases start here
WARMUP_MESSAGES = 200
DEFAULT_PLOT = Path(".msgbus/bench/e2e-latency.png")


class E2EBench:
    def __init__(self, args: argparse.Namespace, stack: DispatchStack) -> None:
        self.args = args
        self.s = stack
        self.dispatch = DispatchBench(args, stack)

    def destination(self, tag: str, broker: str, label: str) -> str:
        code = f"e2e-{tag}"
        subs = self.s.create(code, {"a": self.dispatch.sub("hook", label)},
                             concurrency=self.args.push_concurrency, timeout_ms=5000,
                             broker=BrokerKind(broker))
        self.s.set_paused(subs, False)
        # a RabbitMQ queue exists once its worker runs: sooner, a message is unroutable, takes
        # the direct path, finds no worker either and waits for the compensator's sweep
        eventually(lambda: set(subs) <= self.s.running_workers(), self.args.timeout,
                   f"the dispatcher's worker for {subs}", interval_s=0.2)
        return code

    def send(self, code: str, first: int, count: int, rate: float,
             spool: str) -> dict[str, Any]:
        future = self.s.submit(
            e2e_load.client_send, receiver_url=self.s.receiver_url, api_key=self.s.api_key,
            spool_dir=str(self.s.workdir / "spools" / spool), destination=code, first=first,
            count=count, rate_per_s=rate, threads=CLIENT_THREADS, timeout_s=self.args.timeout)
        eventually(future.done, count / rate + self.args.timeout + 30,
                   f"sending {count} to {code}", interval_s=0.1,
                   progress=lambda: "the load process is sending")
        return future.result()

    def wait_arrived(self, what: str, label: str, lo: int, hi: int, expected: int) -> None:
        def arrived() -> int:
            self.s.check_alive()
            return self.s.count(self.s.sub_url, label, lo, hi)["unique"]

        with contextlib.suppress(NotInTime):
            eventually(lambda: arrived() >= expected, self.args.timeout, what, interval_s=0.25,
                       progress=lambda: f"{arrived()}/{expected} delivered")

    # ---- phases ---------------------------------------------------------------------------

    def warm_up(self, run: int, broker: str, code: str, label: str) -> None:
        """The first messages of a new Kafka topic wait for the consumer group's join."""
        result = self.send(code, 0, WARMUP_MESSAGES, 100.0, f"warm-{broker}-{run}")
        self.wait_arrived(f"run {run} {broker} warm-up", label, 0, WARMUP_MESSAGES,
                          len(result["returned_at"]))

    def saturation(self, fig: E2ERun, broker: str) -> None:
        a, run = self.args, fig.run
        label = f"cap-{broker}-{run}"
        code = self.destination(f"{self.s.run_id}-{run}-{broker}", broker, label)
        self.warm_up(run, broker, code, label)
        self.s.wait_quiet(f"run {run} {broker} warm-up", a.timeout)
        count = int(a.rate * a.duration_s)
        first = WARMUP_MESSAGES
        say(f"run {run}: {broker}, {count} send()s offered at {a.rate:,.0f}/s")
        cpu0, t0 = self.s.stack_cpu_s(), time.time()
        result = self.send(code, first, count, a.rate, f"cap-{broker}-{run}")
        returned: dict[int, float] = result["returned_at"]
        self.wait_arrived(f"run {run} {broker} delivery", label, first, first + count,
                          len(returned))
        wall = time.time() - t0
        cpu1 = self.s.stack_cpu_s()
        records = self.s.records(self.s.sub_url, label, first, first + count)
        arrivals = {n: arrival for n, _, arrival in records}
        last = max(arrivals.values(), default=result["started"])
        cores = {role: (cpu1[role] - cpu0[role]) / wall for role in cpu0}
        cores["producer (client)"] = result["cpu_s"] / wall
        self.s.wait_quiet(f"run {run} {broker} records", a.timeout)
        recorded_at = time.time()
        fig.capacity[broker] = Capacity(
            messages=len(returned),
            send_per_s=len(returned) / max(result["sent_by"] - result["started"], 1e-9),
            accepted_per_s=len(returned) / max(result["spool_empty_at"] - result["started"], 1e-9),
            delivered_per_s=len(arrivals) / max(last - result["started"], 1e-9),
            recorded_per_s=len(returned) / max(recorded_at - result["started"], 1e-9),
            cpu_cores=cores,
            latencies_ms=[(arrivals[n] - t) * 1000 for n, t in returned.items()
                          if n in arrivals])
        self._check(fig, f"{broker} saturation", count, result, arrivals)

    def latency(self, fig: E2ERun) -> None:
        a, run = self.args, fig.run
        rate = fig.capacity["kafka"].delivered_per_s / 2 if "kafka" in fig.capacity \
            else a.rate / 4
        count = max(1, int(rate * a.latency_s))
        fig.latency_rate_per_s = rate
        result, arrivals = self.latency_phase(fig, "lat", rate, count, "latency")
        returned: dict[int, float] = result["returned_at"]
        began = result["started"]
        fig.bus_series = [(t - began, (arrivals[n] - t) * 1000) for n, t in returned.items()
                          if n in arrivals]
        fig.bus_ms = [ms for _, ms in fig.bus_series]
        self.s.wait_quiet(f"run {run} latency", a.timeout)  # every trace is in MongoDB now
        fig.stages_p50_ms = self.stages(fig, result, arrivals)

        say(f"run {run}: baseline, {count} direct POSTs at {rate:,.0f}/s to the subscriber")
        lo = LATENCY_BASE_N
        base_label = f"direct-{run}"
        direct = self.s.submit(e2e_load.paced_direct,
                               url=self.dispatch.sub("hook", base_label), first=lo,
                               count=count, rate_per_s=rate, concurrency=DIRECT_CONCURRENCY)
        stats = direct.result(timeout=count / rate + a.timeout)
        records = self.s.records(self.s.sub_url, base_label, lo, lo + count)
        fig.base_series = [(sent - stats["started"], (arrival - sent) * 1000)
                           for _, sent, arrival in records]
        fig.base_ms = [ms for _, ms in fig.base_series]
        if stats["stats"].get("ok", 0) != count:
            fig.problems.append(f"direct baseline: {stats['stats']}")
        if a.mongo_stopped_phase:
            self.latency_mongo_stopped(fig, rate, count)

    def latency_mongo_stopped(self, fig: E2ERun, rate: float, count: int) -> None:
        """The latency phase again, with the MongoDB server stopped (SIGSTOP) meanwhile: the
        bus's records wait in its local buffers, so this is its overhead without the CPU the
        MongoDB server takes on this machine."""
        result, arrivals = self.latency_phase(fig, "nomongo", rate, count,
                                              "latency with MongoDB stopped",
                                              during=self.mongo_stopped(fig.run))
        fig.mongo_stopped_ms = [(arrivals[n] - t) * 1000
                                for n, t in result["returned_at"].items() if n in arrivals]
        self.s.wait_quiet(f"run {fig.run} records after MongoDB's stop", self.args.timeout)

    def latency_phase(self, fig: E2ERun, tag: str, rate: float, count: int, what: str,
                      during: contextlib.AbstractContextManager[None] | None = None
                      ) -> tuple[dict[str, Any], dict[int, float]]:
        """`count` send()s at `rate` through a new Kafka destination, sent and awaited
        `during` a condition: the load's result and the arrival time of each message."""
        run = fig.run
        label = f"{tag}-{run}"
        code = self.destination(f"{self.s.run_id}-{run}-{tag}", "kafka", label)
        self.warm_up(run, "kafka", code, label)
        say(f"run {run}: {what}, {count} send()s at {rate:,.0f}/s through Kafka")
        lo = LATENCY_BASE_N
        with during or contextlib.nullcontext():
            result = self.send(code, lo, count, rate, label)
            self.wait_arrived(f"run {run} {what} delivery", label, lo, lo + count,
                              len(result["returned_at"]))
        arrivals = {n: arr for n, _, arr in self.s.records(self.s.sub_url, label, lo, lo + count)}
        self._check(fig, what, count, result, arrivals)
        return result, arrivals

    @contextlib.contextmanager
    def mongo_stopped(self, run: int) -> Iterator[None]:
        """The MongoDB server stopped (SIGSTOP) once the records so far are written."""
        self.s.wait_quiet(f"run {run} before stopping MongoDB", self.args.timeout)
        mongo = self.s.cpu_pids["mongo"]
        os.kill(mongo, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(mongo, signal.SIGCONT)

    def stages(self, fig: E2ERun, result: dict[str, Any],
               arrivals: dict[int, float]) -> dict[str, float]:
        """p50 of each stage of the way: send() returned → the receiver accepted (its
        received_at) → the dispatcher began the push (attempt 1's started_at) → arrival; and
        the receiver→push series of the plot, where a stall of the broker or the dispatcher
        shows apart from the client's part."""
        ids: dict[int, str] = result["message_ids"]
        stages = self.s.stages(list(ids.values()))
        parts: dict[str, list[float]] = {"client→receiver": [], "receiver→push": [],
                                         "push→subscriber": []}
        for n, returned in result["returned_at"].items():
            if n in arrivals and ids[n] in stages:
                received, pushed = stages[ids[n]]
                parts["client→receiver"].append((received - returned) * 1000)
                parts["receiver→push"].append((pushed - received) * 1000)
                parts["push→subscriber"].append((arrivals[n] - pushed) * 1000)
                fig.inside_series.append((returned - result["started"], (pushed - received) * 1000))
        return {name: nearest_rank(values, 0.50) for name, values in parts.items()}

    def isolation(self, fig: E2ERun) -> None:
        figures = RunFigures(fig.run)
        alone, mixed = self.dispatch.isolation_destinations(fig.run,
                                                            f"{self.s.run_id}-{fig.run}")
        self.s.wait_quiet(f"run {fig.run} isolation pre-load", self.args.timeout * 2)
        for neighbours in (False, True) if fig.run % 2 else (True, False):
            cpu0 = self.s.stack_cpu_s()
            self.dispatch.isolation(figures, mixed if neighbours else alone,
                                    neighbours=neighbours)
            cpu1 = self.s.stack_cpu_s()
            fig.isolation_cpu["with neighbours" if neighbours else "alone"] = {
                role: (cpu1[role] - cpu0[role]) * 1000 / self.args.iso_messages
                for role in cpu0}
            self.s.wait_quiet(f"run {fig.run} isolation", self.args.timeout)
        fig.alone_per_s = figures.alone_pushes_per_s
        fig.with_neighbours_per_s = figures.with_neighbours_pushes_per_s
        fig.alone_steady_per_s = figures.alone_steady_per_s
        fig.with_neighbours_steady_per_s = figures.with_neighbours_steady_per_s
        fig.neighbour_pushes_per_s = {"B (timeouts)": figures.neighbour_b_per_s,
                                      "C (500s)": figures.neighbour_c_per_s,
                                      "D (300 ms)": figures.neighbour_d_per_s}
        fig.problems += figures.problems

    @staticmethod
    def _check(fig: E2ERun, phase: str, count: int, result: dict[str, Any],
               arrivals: dict[int, float]) -> None:
        returned = result["returned_at"]
        if result["errors"] or len(returned) < count:
            fig.problems.append(f"{phase}: {count - len(returned)} send()s failed "
                                f"{result['errors']}")
        lost = [n for n in returned if n not in arrivals]
        if lost:
            fig.problems.append(f"{phase}: {len(lost)} messages whose send() returned never "
                                f"reached the subscriber (e.g. n={lost[:5]})")
        if result["left_in_spool"]:
            fig.problems.append(f"{phase}: {result['left_in_spool']} left in the client spool")

    def run_once(self, run: int) -> E2ERun:
        fig = E2ERun(run)
        brokers = self.args.brokers if run % 2 else list(reversed(self.args.brokers))
        for broker in brokers:
            self.saturation(fig, broker)
        self.latency(fig)
        self.isolation(fig)
        return fig


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("MSGBUS_"):
        raise argparse.ArgumentTypeError(f"expected MSGBUS_NAME=VALUE, got {text!r}")
    return name, value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("e2e", __doc__, runs=3)
    parser.add_argument("--rate", type=float, default=5000.0,
                        help="send()s per second offered in the saturation phases (above what "
                             "the bus delivers here, so that delivered/s is its capacity)")
    parser.add_argument("--duration-s", type=float, default=15.0,
                        help="seconds of load in each saturation phase")
    parser.add_argument("--latency-s", type=float, default=10.0,
                        help="seconds of load at half capacity, bus and baseline each")
    parser.add_argument("--brokers", type=lambda s: s.split(","), default=["kafka", "rabbitmq"])
    parser.add_argument("--isolation-messages", dest="iso_messages", type=int, default=4000)
    parser.add_argument("--push-concurrency", type=int, default=16,
                        help="every subscription's max_concurrency (the product default)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds any one wait may take before the run gives up")
    parser.add_argument("--kafka-fetch-wait-ms", type=int, default=5,
                        help="the dispatcher's MSGBUS_DISPATCHER_KAFKA_FETCH_WAIT_MS (product "
                             "default 500): tansu, unlike Apache Kafka, answers a fetch only "
                             "when this much time has passed, so it sets the latency here")
    parser.add_argument("--mongo-stopped-phase", action="store_true",
                        help="after the latency phase, the same load again with the MongoDB "
                             "server stopped (SIGSTOP; records wait in the bus's buffers): the "
                             "bus's overhead without the CPU that server takes here")
    parser.add_argument("--mongo-nice", type=int, default=19, choices=range(20),
                        metavar="0-19",
                        help="SecantusDB's nice value (default 19): on this one shared machine "
                             "its record writes, which may lag, yield the CPU to deliveries; "
                             "0 to compare")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="MSGBUS_NAME=VALUE", type=_setting,
                        help="a setting for every bus process (repeatable), e.g. "
                             "MSGBUS_RECEIVER_FLUSH_NICE=0")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT,
                        help=f"PNG of latency over time (default {DEFAULT_PLOT})")
    args = cli.parse_quick(
        parser, argv, "smoke check: 1 run, 4 s phases at 1500/s, 1000 isolation messages",
        runs=1, rate=1500.0, duration_s=4.0, latency_s=4.0, iso_messages=1000)
    unknown = set(args.brokers) - {"kafka", "rabbitmq"}
    if unknown or min(args.runs, args.rate, args.duration_s, args.latency_s) <= 0:
        parser.error(f"brokers are kafka and rabbitmq (got {sorted(unknown)}); counts, rates "
                     "and durations must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work(exits: contextlib.ExitStack) -> list[E2ERun]:
        workdir = cli.scratch_dir(exits, "msgbus-e2e-bench-")
        stack = DispatchStack(workdir, exits, full=True, mongo_nice=args.mongo_nice, settings={
            "MSGBUS_DISPATCHER_KAFKA_FETCH_WAIT_MS": str(args.kafka_fetch_wait_ms),
            **dict(args.settings)})
        stack.start()
        return cli.each_run(E2EBench(args, stack).run_once, args.runs)

    def report(runs: list[E2ERun], began: float) -> int:
        summary, cpu = summarize(runs), cpu_summary(runs)
        out_lines(table(summary, cpu))
        png = plot(runs, args.plot)
        out(f"latency plot: {png}" if png else "latency plot: skipped (matplotlib not installed)")
        elapsed_s = time.monotonic() - began
        out(f"wall time {elapsed_s:.0f} s")
        medians = {name: s["median"] for name, s in summary.items()}
        problems = [f"run {r.run}: {p}" for r in runs for p in r.problems]
        out_json({
            "bench": "e2e",
            "e2e_msgs_per_s": medians.get("kafka_delivered_per_s"),
            "overhead_p50_ms": medians["overhead_p50_ms"],
            "isolation_ratio": medians["isolation_ratio"],
            **({"mongo_stopped_overhead_ratio": medians["mongo_stopped_overhead_ratio"]}
               if "mongo_stopped_overhead_ratio" in medians else {}),
            "bus_p50_ms": medians["bus_p50_ms"], "bus_p95_ms": medians["bus_p95_ms"],
            "bus_p99_ms": medians["bus_p99_ms"],
            "goals": goals(summary), "spread": summary, "cpu_cores": cpu,
            "plot": str(png) if png else None,
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
            | {"elapsed_s": elapsed_s},
            "problems": problems,
        })
        return 1 if problems else 0

    return cli.run(
        f"end-to-end benchmark: {args.runs} run(s); saturation {args.rate:,.0f} msg/s offered "
        f"for {args.duration_s:g} s per broker ({', '.join(args.brokers)}), {args.latency_s:g} s "
        f"at half load, {args.iso_messages} messages per isolation phase; Kafka fetch wait "
        f"{args.kafka_fetch_wait_ms} ms; SecantusDB at nice {args.mongo_nice}", work, report)


if __name__ == "__main__":
    sys.exit(main())
