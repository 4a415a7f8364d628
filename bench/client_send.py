"""Client send benchmark: how fast `msgbus_client` makes messages durable, against the physical
limit of the disk measured in the same run, and how fast a client flushes its spool to a live
receiver.

    python -m bench.client_send [--runs 3] [--raw-messages N] [--single-messages N]
                                [--group-messages N] [--threads 16] [--group-commit-ms 2]
                                [--body-bytes 256] [--workdir DIR] [--quick]

Per run, interleaved so machine noise hits every phase alike (raw and single swap places on
even runs):
  raw     LMDB put+fsync, one transaction per message (the physical limit)
  single  send(), one commit per message, one thread          goal: >= 80% of raw
  group   send(), group commit, 16 threads                    goal: >= 20,000 messages/s
  flush   the group phase's spool, opened against a live receiver (own process): msgs/s
Spools live in fresh dirs on a disk filesystem (never tmpfs). It starts tansu, SecantusDB and a
receiver process, and stops them by PID at the end (also on Ctrl-C, SIGTERM or an error).
Progress goes to stderr; figures to stdout; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import cli
from bench import send_phases as phases
from bench.live_receiver import DeadPort, LiveReceiver
from bench.report import cell, out, out_json, out_lines, say, spread
from bench.send_phases import Sample

REPO = Path(__file__).resolve().parent.parent
GOAL_SINGLE_VS_RAW = 0.80
GOAL_GROUP_MSGS_PER_S = 20_000.0
PHASES = ("raw", "single", "group", "flush")
LABELS = {
    "raw": "raw LMDB put+fsync, 1 txn/msg",
    "single": "send(), commit per message, 1 thread",
    "group": "send(), group commit, {threads} threads",
    "flush": "flush spool -> live receiver",
}
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs", "overlay-tmpfs"}


def filesystem_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) of `path`, from /proc/mounts."""
    best = ("?", "?")
    resolved = str(path.resolve())
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            mount, kind = line.split()[1:3]
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and (best[0] == "?" or len(mount) >= len(best[0])):
                best = (mount, kind)  # the longest mount point holding the path wins
    return best


def pick_workdir(requested: str | None) -> Path:
    """A fresh dir on a disk filesystem: --workdir, else the system temp dir unless it is in
    memory, else under the repo's (git-ignored) .msgbus/ dir."""
    if requested:
        base = Path(requested)
    else:
        base = Path(tempfile.gettempdir())
        if filesystem_of(base)[1] in MEMORY_FILESYSTEMS:
            base = REPO / ".msgbus" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    if filesystem_of(base)[1] in MEMORY_FILESYSTEMS:
        raise SystemExit(f"{base} is on an in-memory filesystem: fsync would be free there; "
                         "pass --workdir on a disk")
    return Path(tempfile.mkdtemp(prefix="msgbus-client-bench-", dir=base))


def summarize(samples: list[Sample]) -> dict[str, Any]:
    by_phase = {p: [s for s in samples if s.phase == p] for p in PHASES}
    rates = {p: spread([s.per_s for s in rows]) for p, rows in by_phase.items()}
    raw = {s.run: s for s in by_phase["raw"]}
    ratios = {
        name: spread([s.per_s / raw[s.run].per_s for s in by_phase[p] if s.run in raw])
        for name, p in (("single_vs_raw", "single"), ("group_vs_raw", "group"))
    }
    per_commit = spread([s.messages / s.commits for s in by_phase["group"] if s.commits])
    settle = spread([s.settle_s for s in by_phase["flush"]])
    return {"rates": rates, "ratios": ratios, "group_msgs_per_commit": per_commit,
            "mongo_recorded_after_flush_s": settle}


def _verdict(value: float, goal: float) -> str:
    if math.isnan(value):
        return "n/a"
    return "met" if value >= goal else "NOT met"


def table(summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
    counts = {"raw": args.raw_messages, "single": args.single_messages,
              "group": args.group_messages, "flush": args.group_messages}
    head = f"{'phase':<40} {'messages':>9} {'msgs/s  min / median / max':>30}"
    lines = [f"min / median / max over {args.runs} run(s)", head, "-" * len(head)]
    for phase in PHASES:
        label = LABELS[phase].format(threads=args.threads)
        lines.append(f"{label:<40} {counts[phase]:>9} "
                     f"{cell(summary['rates'][phase], '.0f'):>30}")
    single, group = summary["ratios"]["single_vs_raw"], summary["ratios"]["group_vs_raw"]
    group_rate = summary["rates"]["group"]
    lines += [
        "",
        "ratios, paired per run (min / median / max)       median vs goal",
        f"{'single / raw':<24} {cell(single, '.3f'):>26}   >= {GOAL_SINGLE_VS_RAW:.2f}: "
        f"{_verdict(single['median'], GOAL_SINGLE_VS_RAW)}",
        f"{'group / raw':<24} {cell(group, '.2f'):>26}",
        f"{'group msgs/s':<24} {cell(group_rate, '.0f'):>26}   >= {GOAL_GROUP_MSGS_PER_S:.0f}: "
        f"{_verdict(group_rate['median'], GOAL_GROUP_MSGS_PER_S)}",
        f"{'group msgs per fsync':<24} {cell(summary['group_msgs_per_commit'], '.1f'):>26}",
        "",
        "flush = accepted by the receiver (durable in its local buffer); the receiver then wrote",
        f"them to MongoDB in {cell(summary['mongo_recorded_after_flush_s'], '.1f')} s more",
    ]
    return lines


class ClientSendBench:
    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.pad = "x" * args.body_bytes
        self.samples: list[Sample] = []

    def setup(self) -> None:
        self.workdir = pick_workdir(self.args.workdir)
        self.stack.callback(shutil.rmtree, self.workdir, ignore_errors=True)
        mount, kind = filesystem_of(self.workdir)
        out(f"spools in {self.workdir} ({kind} mounted on {mount})")
        tag = secrets.token_hex(3)
        self.destinations = {run: f"bench-client-{tag}-r{run}"
                             for run in range(1, self.args.runs + 1)}
        self.dead = DeadPort()
        self.stack.callback(self.dead.close)
        self.lmdb_options = phases.spool_env_options(self.workdir / "probe")
        shutil.rmtree(self.workdir / "probe")
        self.value_size = phases.spooled_value_size(self.destinations[1], self.pad)
        shown = {k: v for k, v in self.lmdb_options.items() if k in ("sync", "metasync",
                                                                     "map_async", "writemap")}
        out(f"raw baseline: LMDB opened like the spool ({shown}); value {self.value_size} bytes"
            f" = one spooled message of this run (body pad {self.args.body_bytes} bytes)")
        self.receiver = LiveReceiver(self.workdir, list(self.destinations.values()), self.stack)
        self.receiver.start()

    def record(self, sample: Sample) -> Sample:
        self.samples.append(sample)
        notes = f"  [{'; '.join(sample.problems)}]" if sample.problems else ""
        commits = (f"  ({sample.messages / sample.commits:.1f} msgs per fsync)"
                   if sample.phase == "group" and sample.commits else "")
        out(f"run {sample.run} {sample.phase:<7} {sample.messages:>7} msgs in "
            f"{sample.seconds:7.2f} s = {sample.per_s:8.0f} msgs/s{commits}{notes}")
        return sample

    def run_once(self, run: int) -> None:
        a = self.args
        destination = self.destinations[run]
        base = self.workdir / f"run{run}"
        raw = functools.partial(phases.raw_put_fsync, base / "raw", a.raw_messages,
                                self.value_size, self.lmdb_options, run)
        single = functools.partial(phases.single_send, base / "single", self.dead.url,
                                   self.receiver.api_key, destination, a.single_messages,
                                   self.pad, run)
        # alternate which of the two paired phases goes first, so neither always gets the
        # fresher disk and caches
        for phase in (raw, single) if run % 2 else (single, raw):
            self.record(phase())
        group = self.record(phases.group_send(base / "group", self.dead.url,
                                              self.receiver.api_key, destination,
                                              a.group_messages, self.pad, run, a.threads,
                                              a.group_commit_ms))
        leftover = self.receiver.buffered()
        if leftover:
            say(f"receiver still has {leftover} buffered messages before the flush")
        flushed = self.record(phases.flush(base / "group", self.receiver.url,
                                           self.receiver.api_key, group.messages, run,
                                           a.timeout))
        recorded, flushed.settle_s = self.receiver.settle(destination, group.messages, a.timeout)
        out(f"run {run} flush: the receiver recorded {recorded}/{group.messages} in MongoDB "
            f"{flushed.settle_s:.1f} s after the spool was empty")
        if recorded != group.messages:
            flushed.problems.append(f"MongoDB holds {recorded} of {group.messages} messages")
        shutil.rmtree(base, ignore_errors=True)

    def run(self) -> None:
        for run in range(1, self.args.runs + 1):
            self.run_once(run)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("client_send", __doc__, runs=3)
    parser.add_argument("--raw-messages", type=int, default=5000)
    parser.add_argument("--single-messages", type=int, default=5000)
    parser.add_argument("--group-messages", type=int, default=20000,
                        help="messages of the group phase, then flushed to the receiver")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--group-commit-ms", type=float, default=2.0)
    parser.add_argument("--body-bytes", type=int, default=256,
                        help="length of the padding string in each message body")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for a flush (and for MongoDB to record it)")
    parser.add_argument("--workdir", help="base dir for the spools (default: the temp dir, "
                        "unless it is tmpfs)")
    args = cli.parse_quick(
        parser, argv, "1 run, 500 raw, 500 single, 2000 group messages (CI smoke)",
        runs=1, raw_messages=500, single_messages=500, group_messages=2000)
    numbers = (args.runs, args.raw_messages, args.single_messages, args.group_messages,
               args.threads)
    if min(numbers) < 1 or args.group_commit_ms <= 0 or args.body_bytes < 0:
        parser.error("counts and --threads must be >= 1, --group-commit-ms > 0")
    if args.group_messages < args.threads:
        parser.error("--group-messages must be >= --threads")
    return args


def figures(summary: dict[str, Any], args: argparse.Namespace, samples: list[Sample],
            elapsed_s: float) -> dict[str, Any]:
    rates, ratios = summary["rates"], summary["ratios"]
    problems = [f"run {s.run} {s.phase}: {p}" for s in samples for p in s.problems]
    names = {"raw_put_fsync_per_s": rates["raw"], "single_commit_msgs_per_s": rates["single"],
             "group_commit_msgs_per_s": rates["group"], "flush_msgs_per_s": rates["flush"],
             "ratio_single_vs_raw": ratios["single_vs_raw"],
             "ratio_group_vs_raw": ratios["group_vs_raw"]}
    return {
        "bench": "client_send",
        **{name: s["median"] for name, s in names.items()},
        "spread": {**names, "group_msgs_per_commit": summary["group_msgs_per_commit"],
                   "mongo_recorded_after_flush_s": summary["mongo_recorded_after_flush_s"]},
        "goals": {"ratio_single_vs_raw": GOAL_SINGLE_VS_RAW,
                  "group_commit_msgs_per_s": GOAL_GROUP_MSGS_PER_S,
                  "single_met": ratios["single_vs_raw"]["median"] >= GOAL_SINGLE_VS_RAW,
                  "group_met": rates["group"]["median"] >= GOAL_GROUP_MSGS_PER_S},
        "runs": args.runs, "threads": args.threads, "group_commit_ms": args.group_commit_ms,
        "messages": {"raw": args.raw_messages, "single": args.single_messages,
                     "group": args.group_messages, "flush": args.group_messages},
        "body_bytes": args.body_bytes, "cpus": os.cpu_count(), "problems": problems,
        "elapsed_s": elapsed_s,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the send() phases talk to a dead port on purpose: the client's warnings about it are noise
    logging.getLogger("msgbus_client").setLevel(logging.ERROR)

    def work(exits: contextlib.ExitStack) -> list[Sample]:
        bench = ClientSendBench(args, exits)
        bench.setup()
        bench.run()
        return bench.samples

    def report(samples: list[Sample], began: float) -> int:
        summary = summarize(samples)
        result = figures(summary, args, samples, time.monotonic() - began)
        out_lines(table(summary, args))
        out(f"\nproblems: {len(result['problems'])}; wall time {result['elapsed_s']:.0f} s")
        for problem in result["problems"]:
            out(f"  {problem}")
        out_json(result)
        return 1 if result["problems"] else 0

    return cli.run(f"client send benchmark: {args.runs} run(s); raw {args.raw_messages}, single "
                   f"{args.single_messages}, group {args.group_messages} messages ({args.threads} "
                   f"threads, group_commit_ms={args.group_commit_ms}); {os.cpu_count()} CPUs",
                   work, report)


if __name__ == "__main__":
    sys.exit(main())
