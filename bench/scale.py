"""`python -m bench.scale`: what idle subscriptions cost (issue 41).

    python -m bench.scale                          # S = 100, 300, 1000; 3 runs each
    python -m bench.scale --sizes 100,300 --runs 1

For each S it starts a bus of its own on private servers (SecantusDB, tansu on S3, a RabbitMQ
node) as separate processes, one receiver, one dispatcher and one compensator, with S
subscriptions: S / 10 destinations of 10 subscriptions each, half on Kafka, half on RabbitMQ,
all pushing to one subscriber. Once every worker is up and `--settle-s` has passed, with
nothing flowing, it measures over `--measure-s`:

- the bus's CPU (its three processes, every thread, from /proc), in ms per second;
- its resident memory and threads;
- per subscription, the CPU and memory above the same run's bus of 20 subscriptions (two
  destinations), divided by the subscriptions added: what one more idle subscription costs;
- MongoDB operations per second (the server's opcounters; the benchmark's own two reads of
  them taken off);

then sends `--samples` messages, one at a time, each to a random destination, and measures
from the send until all 10 of its subscriptions were pushed (p50, p99). A message not pushed to
all of them within `PUSH_WAIT_S` counts that long, and is named with its broker.

Goals (issue 41): `idle_cpu_ms_per_s_per_subscription` <= 0.2, `rss_kb_per_subscription` <=
300, `mongo_ops_per_s` at S = 1,000 <= 50, push p50 <= 1 s and p99 <= 3 s. The cost per
subscription must stay flat or fall as S grows. The last line is one JSON object: per S the
min / median / max over the runs.
"""

from __future__ import annotations

import argparse
import functools
import random
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from msgbus_devtools.testkit.deployment import SUBSCRIPTION, Deployment, Servers, start_servers
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.subscriber import ScriptedSubscriber
from msgbus_devtools.testkit.waiting import NotInTime, eventually

from bench.procs import process_cpu_s
from bench.report import out, out_json, out_lines, say, spread
from msgbus.ids import uuid7
from msgbus.models import BrokerKind
from msgbus.percentiles import nearest_rank
from msgbus.settings import ConnectionSettings

PER_DESTINATION = 10
PUSH_WAIT_S = 30.0  # for one message's pushes; a message that takes longer counts this long
BASELINE_SIZE = 20  # each run's bus with two destinations: what the others are compared with
FIGURES = ("cpu_ms_per_s", "cpu_ms_per_s_per_subscription", "rss_mb",
           "rss_kb_per_subscription", "threads", "mongo_ops_per_s", "push_p50_ms",
           "push_p99_ms")


@dataclass
class ScaleRun:
    size: int
    cpu_ms_per_s: float
    rss_mb: float
    threads: int
    mongo_ops_per_s: float
    push_ms: list[float]

    def figures(self, baseline: ScaleRun) -> dict[str, float]:
        """Totals, and per subscription: the cost above the same run's baseline bus (a few
        subscriptions), divided by the subscriptions added."""
        added = max(1, self.size - baseline.size)
        return {"cpu_ms_per_s": self.cpu_ms_per_s,
                "cpu_ms_per_s_per_subscription":
                    (self.cpu_ms_per_s - baseline.cpu_ms_per_s) / added,
                "rss_mb": self.rss_mb,
                "rss_kb_per_subscription": (self.rss_mb - baseline.rss_mb) * 1024 / added,
                "threads": self.threads, "mongo_ops_per_s": self.mongo_ops_per_s,
                "push_p50_ms": nearest_rank(self.push_ms, 0.5),
                "push_p99_ms": nearest_rank(self.push_ms, 0.99)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,300,1000",
                        help="subscription counts, comma-separated (default %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per size (default 3)")
    parser.add_argument("--settle-s", type=float, default=15.0,
                        help="after every worker is up, before measuring (default 15)")
    parser.add_argument("--measure-s", type=float, default=20.0,
                        help="the idle window (default 20)")
    parser.add_argument("--samples", type=int, default=20,
                        help="messages sent one at a time for the push latency (default 20)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a MSGBUS_* setting of every bus process, for experiments "
                             "(repeatable)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep servers' data and logs here (default: a temp dir, removed)")
    return parser.parse_args(argv)


def _destinations(size: int) -> dict[str, BrokerKind]:
    unique = uuid.uuid4().hex[:6]
    count = max(1, size // PER_DESTINATION)
    return {f"sc{n:04}-{unique}": BrokerKind.KAFKA if n % 2 == 0 else BrokerKind.RABBITMQ
            for n in range(count)}


def _names() -> tuple[str, ...]:
    return (SUBSCRIPTION, *(f"s{n}" for n in range(1, PER_DESTINATION)))


def _pids(deployment: Deployment) -> list[int]:
    return [p.process.pid for p in deployment.processes
            if p.process is not None and p.process.poll() is None]


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _mongo_ops(deployment: Deployment) -> dict[str, int]:
    """The server's operation counters, by kind (query, update, command...)."""
    status = deployment.run(deployment.store.db.client.admin.command("serverStatus"))
    return {kind: int(count) for kind, count in status.get("opcounters", {}).items()}


def _idle(deployment: Deployment, measure_s: float) -> tuple[dict[str, float], float]:
    """CPU ms per second of each of the bus's processes, and MongoDB operations per second
    (their kinds said on stderr)."""
    processes = {p.name: p.process.pid for p in deployment.processes
                 if p.process is not None and p.process.poll() is None}
    ops_before = _mongo_ops(deployment)
    cpu_before = {name: process_cpu_s(pid) for name, pid in processes.items()}
    began = time.monotonic()
    time.sleep(measure_s)  # the measurement itself: nothing to wait for
    cpu = {name: process_cpu_s(pid) - cpu_before[name] for name, pid in processes.items()}
    elapsed = time.monotonic() - began
    ops_after = _mongo_ops(deployment)
    ops = {kind: ops_after[kind] - ops_before.get(kind, 0) for kind in ops_after}
    ops["command"] = ops.get("command", 0) - 1  # this read's own
    say("MongoDB ops/s by kind: " + ", ".join(f"{kind} {count / elapsed:.1f}"
                                              for kind, count in ops.items() if count))
    return ({name: spent * 1000 / elapsed for name, spent in cpu.items()},
            max(0, sum(ops.values())) / elapsed)


def _pushed_everywhere(subscriber: ScriptedSubscriber, message_id: str) -> bool:
    return subscriber.successes().get(message_id, 0) >= PER_DESTINATION


def _push_latencies(deployment: Deployment, subscriber: ScriptedSubscriber,
                    samples: int) -> list[float]:
    """From the send of one message to a random destination until all its subscriptions
    were pushed, in ms, one message at a time."""
    codes = list(deployment.destinations)
    latencies = []
    for n in range(samples):
        message_id, code = uuid7(), random.choice(codes)
        began = time.monotonic()
        post_batches(deployment.receivers[0].url, deployment.api_key,
                     [{"message_id": message_id, "destination": code, "body": {"n": n}}])
        try:
            eventually(functools.partial(_pushed_everywhere, subscriber, message_id),
                       PUSH_WAIT_S, "the message pushed to every subscription",
                       interval_s=0.005)
        except NotInTime:  # counted at the wait's end: a lower bound, and said
            pushed = subscriber.successes().get(message_id, 0)
            say(f"a message to {code} ({deployment.destinations[code].value}) reached "
                f"{pushed} of its {PER_DESTINATION} subscriptions within {PUSH_WAIT_S:g} s")
            latencies.append(PUSH_WAIT_S * 1000)
            continue
        arrived = max(at for mid, _, at in subscriber.answered if mid == message_id)
        latencies.append((arrived - began) * 1000)
    return latencies


def one_run(servers: Servers, work_dir: Path, size: int, args: argparse.Namespace) -> ScaleRun:
    work_dir.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(servers, work_dir, _destinations(size), _names())
    subscriber = ScriptedSubscriber()
    deployment.shared_subscriber = subscriber
    # the product's defaults, not the test kit's faster ones
    deployment.subscription_options = {"dispatchers": 2}
    # the scans across subscriptions walk the index, as on MongoDB: the idle bus's collections
    # are nearly empty, so the stand-in's full scans cost little, and the operations counted are
    # MongoDB's (the test kit looks at each subscription instead: msgbus/store/skipscan.py)
    deployment.extra_env = {"MSGBUS_CONFIG_REFRESH_S": str(ConnectionSettings().config_refresh_s),
                            "MSGBUS_MONGO_INDEX_SKIP_SCANS": "true",
                            **dict(setting.split("=", 1) for setting in args.env)}
    deployment.compensator_settings = {}
    try:
        say(f"S = {size}: starting the bus ({len(deployment.destinations)} destinations)")
        began = time.monotonic()
        deployment.start(workers_within_s=max(120, size * 0.6))
        say(f"S = {size}: every worker up after {time.monotonic() - began:.0f} s; "
            f"settling {args.settle_s:g} s")
        time.sleep(args.settle_s)  # start-up work (topic metadata, first heartbeats) ends
        say(f"S = {size}: measuring {args.measure_s:g} s idle")
        cpu_by_process, ops_per_s = _idle(deployment, args.measure_s)
        cpu_ms_per_s = sum(cpu_by_process.values())
        say("CPU ms/s by process: " + ", ".join(f"{name} {ms:.0f}"
                                                for name, ms in cpu_by_process.items()))
        pids = _pids(deployment)
        rss_mb = sum(_status_kb(pid, "VmRSS") for pid in pids) / 1024
        threads = sum(_status_kb(pid, "Threads") for pid in pids)
        say(f"S = {size}: {cpu_ms_per_s:.0f} ms/s CPU, {rss_mb:.0f} MB, {threads} threads, "
            f"{ops_per_s:.1f} MongoDB ops/s; sending {args.samples} messages")
        latencies = _push_latencies(deployment, subscriber, args.samples)
        return ScaleRun(size, cpu_ms_per_s, rss_mb, threads, ops_per_s, latencies)
    finally:
        deployment.close()


def _spreads(results: dict[int, list[ScaleRun]], baselines: list[ScaleRun]
             ) -> dict[int, dict[str, dict[str, float]]]:
    """Per size, per figure: min / median / max over the runs."""
    return {size: {name: spread([run.figures(base)[name]
                                 for run, base in zip(runs, baselines, strict=True)])
                   for name in FIGURES}
            for size, runs in results.items()}


def _table(spreads: dict[int, dict[str, dict[str, float]]]) -> list[str]:
    sizes = list(spreads)
    lines = [f"{'figure (min/median/max)':<32}" + "".join(f"{f'S = {size}':>26}"
                                                        for size in sizes)]
    for name in FIGURES:
        cells = [spreads[size][name] for size in sizes]
        lines.append(f"{name:<32}" + "".join(
            f"{c['min']:.2f}/{c['median']:.2f}/{c['max']:.2f}".rjust(26) for c in cells))
    return lines


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    signal.signal(signal.SIGTERM, _terminate)
    results: dict[int, list[ScaleRun]] = {size: [] for size in sizes}
    baselines: list[ScaleRun] = []
    with tempfile.TemporaryDirectory(prefix="msgbus-scale-") as tmp:
        base = args.workdir or Path(tmp)
        servers = start_servers(base / "servers")
        try:
            for run in range(args.runs):
                say(f"run {run + 1} of {args.runs}")
                baselines.append(one_run(servers, base / f"run{run}-base", BASELINE_SIZE, args))
                for size in sizes:
                    results[size].append(one_run(servers, base / f"run{run}-{size}", size, args))
        finally:
            servers.close()
    spreads = _spreads(results, baselines)
    out(f"idle cost of the bus's receiver, dispatcher and compensator; per subscription: above "
        f"a bus of {BASELINE_SIZE} subscriptions in the same run; CPU in ms per second")
    out_lines(_table(spreads))
    largest = spreads[max(sizes)]
    out_json({**{str(size): figures for size, figures in spreads.items()},
              "idle_cpu_ms_per_s_per_subscription": largest["cpu_ms_per_s_per_subscription"],
              "rss_kb_per_subscription": largest["rss_kb_per_subscription"],
              "mongo_ops_per_s": largest["mongo_ops_per_s"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
