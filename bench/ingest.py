"""Ingest benchmark: messages/s the receiver accepts, against a bare FastAPI endpoint that only
parses the same JSON, measured in the same run with wrk.

    python -m bench.ingest [--runs 3] [--duration 8] [--batch-duration 3]
                           [--brokers kafka,rabbitmq] [--quick]

About 30 minutes by default (most of it waiting for MongoDB to catch up after batch bursts);
--quick about 3.

Per run (runs are interleaved, so machine noise hits every target alike), for 1 and 2 worker
processes: the bare endpoint with single messages and batches of 100, then the receiver
(`msgbus receiver --workers N`) with single messages and batches of 100 to a Kafka and to a
RabbitMQ destination. Then single messages at half load (paced at half of the rate each target
reached at full load in this run) to the bare endpoint and to the 1-worker receiver, for p99.
Then the payload schema phase: single messages of 20 fields to the 1-worker receiver, to a
destination whose schema checks those 20 fields and to one without a schema (first broker; in
the order with, without, without, with), for the throughput with validation ÷ without
(`--only-schema` runs this phase alone).
After each receiver phase it waits until the receiver's buffers are empty (so that one phase's
background writes to the brokers and MongoDB do not slow the next), then checks that MongoDB
holds every message the phase had answered with success. Batch phases are shorter by default:
MongoDB records far fewer messages/s than the receiver accepts, so each burst takes a while to
flush.

Starts everything it needs (bench/ingest_stack.py) and stops it by PID at the end, also on
Ctrl-C, SIGTERM or an error. Progress goes to stderr; figures to stdout; the last line is one
JSON object with `ratio_single_vs_bare`, `batch_msgs_per_s` and `p99_ratio_vs_bare` (medians;
of the worse broker) and everything else. Goals missed do not change the exit code; problems
(messages not in MongoDB, request errors) make it 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from bench.client_send import MEMORY_FILESYSTEMS, filesystem_of
from bench.ingest_report import Phase, summarize, table
from bench.ingest_stack import IngestStack, Target
from bench.report import out, rounded, say
from bench.wrk_runner import WrkError, run_wrk, wrk_binary

REPO = Path(__file__).resolve().parent.parent
BATCH_SIZE = 100
WRK_THREADS = 2
CONNECTIONS = {"single": 64, "batch": 32, "half": 32}
SCHEMA_MODES = {"with": "fields20+schema", "without": "fields20"}


class IngestBench:
    def __init__(self, args: argparse.Namespace, stack: IngestStack) -> None:
        self.args = args
        self.stack = stack
        self.phases: list[Phase] = []

    def run(self) -> None:
        self.warm_up()
        for run in range(1, self.args.runs + 1):
            say(f"=== run {run}/{self.args.runs}")
            if not self.args.only_schema:
                self.measure_full_set(run)
            self.measure_schema(run)

    def measure_full_set(self, run: int) -> None:
        for workers in (1, 2):
            bare = self.stack.bare[workers]
            for mode in ("single", "batch"):
                self.measure(run, bare, "", mode)
            receiver = self.stack.receivers[workers]
            for broker in self.args.brokers:
                for mode in ("single", "batch"):
                    self.measure(run, receiver, broker, mode)
        self.measure_half_load(run)

    def measure_schema(self, run: int, duration_s: int | None = None) -> None:
        """Single messages of 20 fields, to the destination with a schema and to the one
        without, in the order with, without, without, with: what drifts during a run (the
        machine's other load, MongoDB catching up) weighs on both alike."""
        receiver, broker = self.stack.receivers[1], self.args.brokers[0]
        for kind in ("with", "without", "without", "with"):
            phase = self.measure(run, receiver, broker, SCHEMA_MODES[kind],
                                 duration_s=duration_s, code=self.stack.schema_destinations[kind])
            # the receiver validated (and recorded the version) only where there is a schema
            versions = self.stack.schema_versions(phase.result.id_prefix)
            if versions != ({1} if kind == "with" else {None}):
                phase.problems.append(f"recorded schema versions {versions}")

    def warm_up(self) -> None:
        """Connections, Kafka topics and first-request costs, not reported."""
        say("warming up (not reported)")
        seconds = self.args.warmup
        self.measure_schema(0, seconds)
        for workers in () if self.args.only_schema else (1, 2):
            for mode in ("single", "batch"):
                self.measure(0, self.stack.bare[workers], "", mode, duration_s=seconds)
                for broker in self.args.brokers:
                    self.measure(0, self.stack.receivers[workers], broker, mode,
                                 duration_s=seconds)
        self.phases = [p for p in self.phases if p.run != 0]

    def measure_half_load(self, run: int) -> None:
        full = {p.key: p.requests_per_s for p in self.phases if p.run == run}
        targets = [(self.stack.bare[1], "")] + [(self.stack.receivers[1], b)
                                                 for b in self.args.brokers]
        for target, broker in targets:
            rate = full.get(" ".join(x for x in (target.name, broker, "single") if x), 0) / 2
            if rate > 0:
                self.measure(run, target, broker, "half", rate_per_s=rate)

    def measure(self, run: int, target: Target, broker: str, mode: str, *,
                duration_s: int | None = None, rate_per_s: float | None = None,
                code: str | None = None) -> Phase:
        duration_s = duration_s or (self.args.batch_duration if mode == "batch"
                                    else self.args.duration)
        if code is None:
            code = self.stack.destinations[(target.workers, broker)] if broker else "bare"
        wrk_mode = "fields20" if mode in SCHEMA_MODES.values() else (
            "batch" if mode == "batch" else "single")
        connections = CONNECTIONS.get(mode, CONNECTIONS["single"])
        per_request = BATCH_SIZE if mode == "batch" else 1
        label = " ".join(x for x in (target.name, broker, mode) if x)
        say(f"run {run} {label}: {duration_s:g} s, {connections} connections"
            + (f", paced at {rate_per_s:.0f} req/s" if rate_per_s else ""))
        cpu_before = self.stack.cpu_s(target) if target.is_receiver else 0.0
        result = run_wrk(target.url, wrk_mode, code,
                         self.stack.api_key, duration_s=duration_s, threads=WRK_THREADS,
                         connections=connections, batch_size=BATCH_SIZE,
                         rate_per_s=rate_per_s)
        phase = Phase(run, target.name, broker, mode, result, per_request,
                      offered_per_s=rate_per_s)
        if result.failed:
            phase.problems.append(f"{result.failed} requests failed {result.errors}")
        if target.is_receiver:
            self.settle(phase, target)
            phase.cpu_s = self.stack.cpu_s(target) - cpu_before
            if broker == "rabbitmq":
                self.stack.purge_rabbitmq()
        self.phases.append(phase)
        say(f"  -> {phase.line()}")
        return phase

    def settle(self, phase: Phase, target: Target) -> None:
        left, phase.settle_s = self.stack.wait_flushed(target, self.args.settle_timeout)
        if left:
            phase.problems.append(f"{left} buffer entries still there after "
                                  f"{self.args.settle_timeout:.0f} s")
        accepted = phase.result.ok_requests * phase.messages_per_request
        recorded = self.stack.recorded(phase.result.id_prefix)
        # requests still in flight when wrk stopped may have been accepted too: >= is right
        if recorded < accepted:
            phase.problems.append(f"only {recorded} of {accepted} accepted messages in MongoDB")


def pick_workdir() -> Path:
    """A fresh dir on a disk filesystem (fsync is free on tmpfs)."""
    base = Path(tempfile.gettempdir())
    if filesystem_of(base)[1] in MEMORY_FILESYSTEMS:
        base = REPO / ".msgbus" / "bench"
        base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="msgbus-bench-ingest-", dir=base))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=int, default=8,
                        help="seconds of each measured wrk run")
    parser.add_argument("--batch-duration", type=int, default=3,
                        help="seconds of each batch run (each needs a long MongoDB catch-up)")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of each warm-up")
    parser.add_argument("--brokers", type=lambda s: s.split(","), default=["kafka", "rabbitmq"])
    parser.add_argument("--settle-timeout", type=float, default=240.0,
                        help="seconds to wait for a receiver to flush its buffers after a phase")
    parser.add_argument("--quick", action="store_true",
                        help="1 run of 1 s phases and warm-ups (smoke test)")
    parser.add_argument("--only-schema", action="store_true",
                        help="only the payload schema phase (validation vs none)")
    parser.add_argument("--receiver-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the receivers (repeatable), e.g. "
                             "MSGBUS_RECEIVER_DEDUPE_ACROSS_RECEIVERS=false to measure without "
                             "the cross-receiver claim")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.duration, args.batch_duration, args.warmup = 1, 1, 1, 1
        args.settle_timeout = 60.0
    if unknown := set(args.brokers) - {"kafka", "rabbitmq"}:
        parser.error(f"unknown brokers: {', '.join(sorted(unknown))}")
    bad = [e for e in args.receiver_env if not e.startswith("MSGBUS_RECEIVER_") or "=" not in e]
    if bad:
        parser.error(f"--receiver-env takes MSGBUS_RECEIVER_NAME=VALUE, not {bad[0]!r}")
    args.receiver_env = dict(e.split("=", 1) for e in args.receiver_env)
    return args


def _exit_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(143)  # unwinds the ExitStack: everything started is stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    wrk_binary()
    began = time.monotonic()
    with contextlib.ExitStack() as exits:
        workdir = pick_workdir()
        exits.callback(shutil.rmtree, workdir, ignore_errors=True)
        mount, kind = filesystem_of(workdir)
        say(f"workdir {workdir} ({kind} on {mount}); brokers {', '.join(args.brokers)}; "
            f"{args.runs} run(s) of {args.duration:g} s phases")
        stack = IngestStack(workdir, exits, args.brokers, receiver_env=args.receiver_env)
        stack.start()
        bench = IngestBench(args, stack)
        try:
            bench.run()
        except WrkError as exc:
            say(f"wrk failed: {exc}")
            raise
        summary = summarize(bench.phases, args.brokers)
    for phase in bench.phases:
        out(phase.line())
    out()
    for line in table(summary):
        out(line)
    summary["elapsed_s"] = round(time.monotonic() - began, 1)
    summary["settings"] = {"runs": args.runs, "duration_s": args.duration,
                           "batch_duration_s": args.batch_duration,
                           "batch_size": BATCH_SIZE, "wrk_threads": WRK_THREADS,
                           "connections": CONNECTIONS, "brokers": args.brokers,
                           "only_schema": args.only_schema,
                           "receiver_env": args.receiver_env,
                           "half_load": "wrk paced (delay() hook) at half of the full-load "
                                        "req/s of the same target and run"}
    out(json.dumps(rounded(summary), sort_keys=False))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
