"""End-to-end pipeline benchmark: producer -> receiver -> Kafka | RabbitMQ | direct -> dispatcher
-> one recording subscriber, against a direct-HTTP baseline (producer -> subscriber, no bus)
measured in the same run.

    python -m bench.pipeline [--messages N] [--concurrency C] [--runs 3]
                             [--brokers kafka,rabbitmq,direct] [--quick]

Starts its own tansu and SecantusDB on free ports (and uses the machine's RabbitMQ), runs the
bus in-process, the subscriber and the producer in processes of their own (spawn), and stops
everything it started by PID at the end, also on Ctrl-C or an error. Each run sends N messages
to the baseline and to each broker in turn; progress goes to stderr every few seconds; figures
go to stdout, and the last line is one JSON object. Everything targets 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import sys
import time
import uuid
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import httpx
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.waiting import NotInTime, eventually

from bench import cli, load, producer, subscriber
from bench.report import BASELINE, Phase, out, out_json, out_lines, say, summarize, table

HOST = "127.0.0.1"
BROKERS = ("kafka", "rabbitmq", "direct")
SUBSCRIPTION = "rec"


def stop_process(process: BaseProcess, name: str) -> None:
    """SIGTERM a child process we started (by its pid), SIGKILL it if it lingers."""
    if process.is_alive():
        say(f"stopping {name} (pid {process.pid})")
        process.terminate()
        process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)


def start_subscriber(ctx: Any, exits: contextlib.ExitStack) -> int:
    """The bench subscriber (bench/subscriber.py) in a child process, stopped by `exits`;
    returns its port, once it listens."""
    port = services.free_port()
    process = ctx.Process(target=subscriber.serve, args=(port,), name="bench-sub", daemon=True)
    process.start()
    exits.callback(stop_process, process, "subscriber")
    services.wait_for_port(HOST, port, 30)
    return port


def figures_of(process: BaseProcess, parent_conn: Connection, child_conn: Connection,
               timeout_s: float, label: str) -> dict[str, Any]:
    """Start a phase's child process, wait up to `timeout_s` for the figures it sends on the
    pipe, then stop it (by its pid) and close the pipe."""
    process.start()
    child_conn.close()
    try:
        if not parent_conn.poll(timeout_s):
            raise RuntimeError(f"phase {label} gave no figures in time")
        figures: dict[str, Any] = parent_conn.recv()
        process.join(10)
    finally:
        stop_process(process, f"phase {label}")
        parent_conn.close()
    return figures


def delete_rabbitmq_topology(url: str, destinations: list[str]) -> None:
    """Remove the exchanges and queues the bus declared for our destinations."""
    if not destinations:
        return
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for destination in destinations:
            channel.queue_delete(f"msgbus.{destination}.{SUBSCRIPTION}")
            channel.exchange_delete(f"msgbus.{destination}")
    finally:
        connection.close()


class PipelineBench:
    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.brokers: list[str] = args.brokers
        self.next_n: dict[str, int] = {}
        self.destinations: dict[str, str] = {}
        self.http = httpx.Client(timeout=10)
        stack.callback(self.http.close)

    # ---- setup ---------------------------------------------------------------------------

    def setup(self) -> None:
        workdir = cli.scratch_dir(self.stack, "msgbus-bench-")
        logs = workdir / "logs"
        kafka = rabbit_url = ""
        rabbit_destinations: list[str] = []
        if "kafka" in self.brokers:
            tansu = services.start_tansu(services.free_port(), logs)
            self.stack.callback(tansu.stop)
            kafka = tansu.url
        secantus = services.start_secantus(services.free_port(), workdir / "mongo", logs)
        self.stack.callback(secantus.stop)
        if "rabbitmq" in self.brokers:
            rabbit = services.ensure_rabbitmq()
            rabbit_url = rabbit.url
            if rabbit.started_by_us:
                self.stack.callback(services.stop_rabbitmq)
            self.stack.callback(delete_rabbitmq_topology, rabbit_url, rabbit_destinations)

        ctx = multiprocessing.get_context("spawn")
        sub_port = start_subscriber(ctx, self.stack)
        self.conn, child_conn = ctx.Pipe()
        self.producer = ctx.Process(target=producer.worker, args=(child_conn,),
                                    name="bench-producer", daemon=True)
        self.producer.start()
        self.stack.callback(stop_process, self.producer, "producer")
        self.stack.callback(self._tell_producer_to_exit)
        self.sub_url = f"http://{HOST}:{sub_port}"

        from msgbus_devtools.testkit.bus import (
            RunningBus,  # heavy: keep it out of the spawned children
        )
        from msgbus_devtools.testkit.loop import BackgroundLoop

        loop = BackgroundLoop()
        self.stack.callback(loop.close)
        say("starting the bus in-process (receiver, dispatcher, compensator, admin)")
        self.bus = RunningBus(loop, mongo_uri=secantus.url, mongo_db="bench",
                              state_dir=workdir / "bus-state", kafka_bootstrap=kafka,
                              rabbitmq_url=rabbit_url)
        self.bus.start()
        self.stack.callback(self.bus.close)
        self.api_key = self.bus.create_app("bench")
        suffix = uuid.uuid4().hex[:8]
        for broker in self.brokers:
            destination = f"bench-{broker}-{suffix}"
            self.bus.create_destination(destination, broker)
            if broker == "rabbitmq":
                rabbit_destinations.append(destination)
            self.bus.subscribe(destination, SUBSCRIPTION, f"{self.sub_url}/hook/{broker}",
                               max_concurrency=self.args.push_concurrency)
            self.destinations[broker] = destination
        self._wait_for_workers({f"{d}/{SUBSCRIPTION}" for d in self.destinations.values()})

    def _wait_for_workers(self, sub_ids: set[str], timeout_s: float = 60) -> None:
        began = time.monotonic()
        say("waiting for the dispatcher's workers (a Kafka group join takes a few seconds)")
        running: set[str] = set()

        def ready() -> bool:
            health = self.http.get(f"{self.bus.dispatcher_url}/health").json()
            running.clear()
            running.update(sub_ids & set(health["subscriptions"]))
            return running == sub_ids

        eventually(ready, timeout_s, "the dispatcher's workers", interval_s=0.1,
                   progress=lambda: (f"{len(running)}/{len(sub_ids)} ready, missing "
                                     f"{sorted(sub_ids - running)}"))
        say(f"dispatcher workers ready after {time.monotonic() - began:.1f} s")

    def _tell_producer_to_exit(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.producer.join(5)

    # ---- one phase: N messages to one target ---------------------------------------------

    def phase(self, target: str, run: int, count: int) -> Phase:
        lo = self.next_n.get(target, 0)
        hi = self.next_n[target] = lo + count
        if target == BASELINE:
            url, key = f"{self.sub_url}/hook/{BASELINE}", ""
        else:
            url = f"{self.bus.receiver_url}/v1/destinations/{self.destinations[target]}/messages"
            key = self.api_key
        timeout_s = self.args.timeout
        began = time.monotonic()
        self.conn.send({"url": url, "api_key": key, "start": lo, "count": count,
                        "concurrency": self.args.concurrency, "deadline": time.time() + timeout_s})
        label = f"run {run} {target}" if run else f"warm-up {target}"
        # the producer's progress and result, and how many of the messages arrived
        seen: dict[str, Any] = {"result": None, "accepted": 0, "delivered": 0}

        def all_delivered() -> bool:
            # before the result, a wait of 0.1 s on the pipe too: a look every 0.2 s, as after
            if seen["result"] is None and self.conn.poll(0.1):
                kind, payload = self.conn.recv()
                if kind == "progress":
                    seen["accepted"] = payload
                else:
                    seen["result"], seen["accepted"] = payload, payload["accepted"]
            if seen["result"] is None and not self.producer.is_alive():
                raise RuntimeError(f"the producer process died (exit {self.producer.exitcode})")
            seen["delivered"] = self._count(target, lo, hi)["unique"]
            return seen["result"] is not None and seen["delivered"] >= count

        try:
            eventually(all_delivered, timeout_s + load.REQUEST_TIMEOUT_S,
                       f"{label}: every message delivered", interval_s=0.1,
                       progress=lambda: (f"accepted {seen['accepted']}/{count}, "
                                         f"delivered {seen['delivered']}/{count}"))
        except NotInTime:
            say(f"{label}: gave up after {time.monotonic() - began:.0f} s with "
                f"{count - seen['delivered']} messages missing")
        result: dict[str, Any] | None = seen["result"]
        assert result is not None
        records = self.http.get(f"{self.sub_url}/_records/{target}",
                                params={"lo": lo, "hi": hi}).json()
        counts = self._count(target, lo, hi)
        settle_s = 0.0 if target == BASELINE else self._settle(target, label, hi)
        return Phase(
            target=target, run=run, messages=count, accepted=result["accepted"],
            failed=result["failed"], not_sent=result["not_sent"], retries=result["retries"],
            accept_s=result["accept_s"], first_sent=result["first_sent"],
            delivered=len(records), duplicates=counts["duplicates"],
            last_arrival=max((a for _, _, a in records), default=result["first_sent"]),
            latencies_ms=[(a - s) * 1000 for _, s, a in records], settle_s=settle_s,
            problems=result["problems"])

    def _count(self, target: str, lo: int, hi: int) -> dict[str, int]:
        response = self.http.get(f"{self.sub_url}/_count/{target}", params={"lo": lo, "hi": hi})
        return dict(response.json())

    def _settle(self, broker: str, label: str, expected: int) -> float:
        """Wait until the bus has written this phase's trace to MongoDB and flushed its local
        buffers, so one phase's background writes do not slow the next. Returns the seconds."""
        from msgbus.models import DeliveryStatus

        sub_id = f"{self.destinations[broker]}/{SUBSCRIPTION}"
        began = time.monotonic()
        seen = {"traced": 0, "buffered": 0, "backlog": 0}

        def settled() -> bool:
            seen["traced"] = self.bus.query(self.bus.store.progress.count_deliveries(
                sub_id, DeliveryStatus.DELIVERED))
            seen["buffered"] = sum(self.http.get(f"{self.bus.receiver_url}/health").json()
                                   ["buffer"].values())
            seen["backlog"] = self.http.get(f"{self.bus.dispatcher_url}/health").json()[
                "trace_backlog"]
            return seen["traced"] >= expected and seen["buffered"] == seen["backlog"] == 0

        def state() -> str:
            return (f"traced {seen['traced']}/{expected}, receiver buffer {seen['buffered']}, "
                    f"trace backlog {seen['backlog']}")

        try:
            eventually(settled, self.args.settle_timeout, f"{label}: the trace", interval_s=0.25,
                       progress=state)
        except NotInTime:
            say(f"{label}: trace not settled after {time.monotonic() - began:.0f} s ({state()});"
                " going on")
        return time.monotonic() - began

    # ---- the whole benchmark -------------------------------------------------------------

    def run(self) -> list[Phase]:
        targets = [BASELINE, *self.brokers]
        if self.args.warmup:
            for target in targets:
                say(self.phase(target, 0, self.args.warmup).line().replace("run 0", "warm-up"))
        phases = []
        for run in range(1, self.args.runs + 1):
            for target in targets:  # interleaved, so noise hits every target alike
                phases.append(self.phase(target, run, self.args.messages))
                out(phases[-1].line())
        return phases


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("pipeline", __doc__)
    parser.add_argument("--messages", type=int, default=2000, help="messages per run and target")
    parser.add_argument("--concurrency", type=int, default=32, help="producer requests in flight")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--brokers", default=",".join(BROKERS),
                        help="comma-separated subset of kafka,rabbitmq,direct")
    parser.add_argument("--warmup", type=int, default=200,
                        help="unreported messages per target before the first run (0: none)")
    parser.add_argument("--push-concurrency", type=int, default=16,
                        help="the subscription's max_concurrency (the product default is 16)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for one phase's messages before counting missing")
    parser.add_argument("--settle-timeout", type=float, default=60.0,
                        help="seconds to wait for the bus to write a phase's trace")
    args = cli.parse_quick(parser, argv, "300 messages, 1 run, 50 warm-up",
                           messages=300, runs=1, warmup=50)
    args.brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    unknown = set(args.brokers) - set(BROKERS)
    if unknown or not args.brokers:
        parser.error(f"--brokers: choose from {','.join(BROKERS)}; got {args.brokers}")
    if min(args.messages, args.concurrency, args.runs, args.push_concurrency) < 1:
        parser.error("--messages, --concurrency, --runs and --push-concurrency must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work(exits: contextlib.ExitStack) -> list[Phase]:
        bench = PipelineBench(args, exits)
        bench.setup()
        return bench.run()

    def report(phases: list[Phase], began: float) -> int:
        summary = summarize(phases, [BASELINE, *args.brokers])
        elapsed_s = time.monotonic() - began
        out_lines(table(summary))
        missing = sum(t["missing"] for t in summary["targets"].values())
        out(f"\nmissing messages: {missing}; wall time {elapsed_s:.0f} s")
        out_json({"bench": "pipeline", "messages": args.messages, "runs": args.runs,
                  "concurrency": args.concurrency, "push_concurrency": args.push_concurrency,
                  "baseline": BASELINE, **summary, "missing_total": missing,
                  "elapsed_s": elapsed_s})
        return 1 if missing else 0

    brokers = ",".join(args.brokers)
    return cli.run(f"pipeline benchmark: {args.runs} run(s) x {args.messages} messages per target, "
                   f"producer concurrency {args.concurrency}, push concurrency "
                   f"{args.push_concurrency}, brokers {brokers}, baseline {BASELINE}", work, report)


if __name__ == "__main__":
    sys.exit(main())
