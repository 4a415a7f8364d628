"""Compensator benchmark (issue 6): claims + deliveries per second on a backlog of due retries,
the time a sweep takes as the pending deliveries grow, and (issue 29) the due scan's claim time
beside many scheduled deliveries that wait far ahead.

    python -m bench.compensator [--runs 3] [--retries 100000] [--subscriptions 4]
                                [--compensators 1] [--sizes 10000,100000,1000000]
                                [--due 1000] [--scheduled-waiting 100000]
                                [--scheduled-due 2000] [--only-scheduled] [--quick]

Everything runs on 127.0.0.1: SecantusDB, one recording subscriber process and
`--compensators` `msgbus compensator` processes, all stopped by PID at the end (also on Ctrl-C,
SIGTERM or an error).

1. claims (per run): `--retries` messages with a failed delivery due (their retries fell due
   over the last retries/1000 seconds, as after an outage at 1,000 failures/s), spread over
   `--subscriptions` paused subscriptions (max_concurrency 64) of one destination, are written
   straight into MongoDB; then the subscriptions are resumed. claims_per_s = retries ÷ the
   time from the resume until every delivery is recorded delivered (so it includes each
   claim, push and trace write). The subscriber's unique and duplicate counts are checked.
2. sweep (once the runs are done, in this process): a fresh subscription gets `--due`
   messages recorded an hour ago without an outcome (due for the sweep) and, growing from size
   to size, recent pending batches without outcomes (a backlog behind the dispatcher, not
   due). At each size one `Sweeper.sweep()` pass is timed three times (the swept ones are put
   back to pending in between). The figure to watch: how the sweep time grows from the
   smallest to the largest size (it should stay flat: the work is the due deliveries and the
   first batch of the backlog, found through an index, not the collection).
3. scheduled (`--runs` times, each in a new database of the same SecantusDB; skipped with
   `--scheduled-waiting 0`, alone with `--only-scheduled`, which starts no compensator or
   subscriber): bench.delays' due-scan measurement (`bench.delays.due_scan`, whose doc says
   more). `--scheduled-due` scheduled deliveries due now are claimed, 256 at a time, as a
   compensator's retry loop does, alone and then beside `--scheduled-waiting` scheduled
   deliveries due 1 to 30 days ahead; an idle scan (nothing due) is timed beside each. The
   figure to watch: claim time with them waiting ÷ without (it should stay near 1: a scan's
   cost grows with what is due, not with what waits).

Progress goes to stderr; per-run lines, a min/median/max table and, as the last line, one JSON
object go to stdout. Problems (missing or duplicate deliveries) make the exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import eventually
from pydantic import HttpUrl

from bench import cli
from bench.delays import due_scan_lines, due_scan_runs, due_scan_summary
from bench.dispatch_stack import with_store
from bench.procs import process_cpu_s, stop_process
from bench.report import cell, out, out_lines, say, spread
from compensator.sweeper import Sweeper
from msgbus.ids import uuid7
from msgbus.models import BrokerKind, Destination, Envelope, Subscription, utcnow
from msgbus.settings import CompensatorSettings
from msgbus.store import MongoStore
from msgbus.store import documents as docs
from msgbus.store.claims import DeliveryClaims
from msgbus.store.pending import PendingSweep

HOST = "127.0.0.1"
INSERT_CHUNK = 5000
RECORD_BATCH = 500  # messages per pending batch, as the receiver's record batches
# the backlog's failures happened at this rate, so their retries fell due spread over time
# (a subscriber that was down while messages kept coming), the oldest first
FAILED_PER_S = 1000
SWEEP_TIMINGS = 3


def message_body(n: int) -> bytes:
    return orjson.dumps({"n": n, "sent_at": time.time()})


class CompensatorBench:
    def __init__(self, args: argparse.Namespace, workdir: Path,
                 exits: contextlib.ExitStack) -> None:
        self.args = args
        self.workdir = workdir
        self.exits = exits
        self.db = f"bench_comp_{secrets.token_hex(3)}"
        self.processes: list[subprocess.Popen[bytes]] = []

    # ---- the stack ------------------------------------------------------------------------

    def start_mongo(self) -> None:
        mongo = services.start_secantus(services.free_port(), self.workdir / "mongo",
                                        self.workdir / "logs")
        self.exits.callback(mongo.stop)
        self.mongo_uri = mongo.url
        self.mongo_pid = mongo.pid

    def start(self) -> None:
        """SecantusDB, the subscriber and the compensators (the claims and sweep phases)."""
        self.start_mongo()
        port = services.free_port()
        self.sub_url = f"http://{HOST}:{port}"
        self._spawn("subscriber", [sys.executable, "-c",
                                   f"from bench.dispatch_subscriber import serve; serve({port})"])
        services.wait_for_port(HOST, port, 30)
        env = service_env({
            "MSGBUS_MONGO_URI": self.mongo_uri, "MSGBUS_MONGO_DB": self.db,
            "MSGBUS_CONFIG_REFRESH_S": "1", "MSGBUS_COMPENSATOR_SCAN_INTERVAL_S": "0.2"})
        self.compensator_pids = []
        for i in range(self.args.compensators):
            process = self._spawn(
                f"compensator-{i}",
                [sys.executable, "-m", "msgbus_cli", "compensator", "--state-dir",
                 str(self.workdir / f"compensator-{i}")],
                env | {"MSGBUS_COMPENSATOR_PORT": str(services.free_port()),
                       "MSGBUS_COMPENSATOR_INSTANCE": f"bench-compensator-{i}"})
            self.compensator_pids.append(process.pid)
        self.http = httpx.Client(timeout=30)
        self.exits.callback(self.http.close)

    def _spawn(self, name: str, command: list[str],
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as handle:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                       stdout=handle, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.exits.callback(stop_process, process, name)
        self.processes.append(process)
        return process

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args!r} exited with {process.returncode}")

    def run(self, work: Callable[[MongoStore], Awaitable[Any]]) -> Any:
        return with_store(self.mongo_uri, self.db, work)

    # ---- phase 1: claims ------------------------------------------------------------------

    async def _prepare_retries(self, store: MongoStore, run: int) -> list[Subscription]:
        await store.ensure_indexes()
        code = f"bench-comp-r{run}"
        await store.config.save_destination(Destination(code=code, broker=BrokerKind.DIRECT))
        subs = [Subscription(destination=code, name=f"s{i}", paused=True, max_concurrency=64,
                             url=HttpUrl(f"{self.sub_url}/hook/r{run}-s{i}"))
                for i in range(self.args.subscriptions)]
        for sub in subs:
            await store.config.save_subscription(sub)
        now = utcnow()
        for lo in range(0, self.args.retries, INSERT_CHUNK):
            hi = min(lo + INSERT_CHUNK, self.args.retries)
            envelopes = [Envelope(message_id=uuid7(), destination=code, body=message_body(n),
                                  created_at=now - timedelta(seconds=60)) for n in range(lo, hi)]
            sub_of = [subs[n % len(subs)].id for n in range(lo, hi)]
            await store.db.messages.insert_many(
                [docs.message_doc(e, [s]) for e, s in zip(envelopes, sub_of, strict=True)])
            due_at = [now - timedelta(seconds=(self.args.retries - n) / FAILED_PER_S)
                      for n in range(lo, hi)]
            await store.db.deliveries.insert_many([
                docs.delivery_doc(e, s, now) | {
                    "status": "failed", "next_attempt_at": at, "attempts": 1}
                for e, s, at in zip(envelopes, sub_of, due_at, strict=True)])
            say(f"run {run}: {hi:,}/{self.args.retries:,} due retries written")
        return subs

    async def _resume(self, store: MongoStore, subs: list[Subscription]) -> None:
        for sub in subs:
            await store.config.save_subscription(sub.model_copy(update={"paused": False}))

    async def _recorded(self, store: MongoStore, subs: list[Subscription]) -> int:
        """Deliveries recorded delivered: an index range count per subscription."""
        return sum([await store.db.deliveries.count_documents(
            {"subscription": sub.id, "status": "delivered"}) for sub in subs])

    def _pushed(self, run: int) -> tuple[int, int]:
        """Unique and duplicate pushes the subscriber got (cheap: no MongoDB query, so the
        progress polls do not slow the server being measured)."""
        counts = [self.http.get(f"{self.sub_url}/_count/r{run}-s{i}",
                                params={"lo": 0, "hi": self.args.retries}).json()
                  for i in range(self.args.subscriptions)]
        return sum(c["unique"] for c in counts), sum(c["duplicates"] for c in counts)

    def claims(self, run: int) -> dict[str, Any]:
        subs = self.run(lambda store: self._prepare_retries(store, run))
        cpu0 = [process_cpu_s(p) for p in self.compensator_pids]
        mongo_cpu0 = process_cpu_s(self.mongo_pid)
        began = time.monotonic()
        self.run(lambda store: self._resume(store, subs))
        n = self.args.retries

        def pushed_all() -> bool:
            self.check_alive()
            return self._pushed(run)[0] >= n

        eventually(pushed_all, self.args.timeout, f"run {run} claims", interval_s=1.0,
                   progress=lambda: f"{self._pushed(run)[0]:,}/{n:,} pushed")
        eventually(lambda: self.run(lambda store: self._recorded(store, subs)) >= n,
                   self.args.timeout, f"run {run} trace", interval_s=0.5)
        elapsed = time.monotonic() - began
        unique, duplicates = self._pushed(run)
        figures = {
            "run": run, "claims_per_s": n / elapsed, "elapsed_s": elapsed,
            "compensator_cpu_ms_per_1k": (sum(process_cpu_s(p) for p in self.compensator_pids)
                                          - sum(cpu0)) * 1e6 / n,
            "mongo_cpu_ms_per_1k": (process_cpu_s(self.mongo_pid) - mongo_cpu0) * 1e6 / n,
            "unique": unique, "duplicates": duplicates,
            "problems": ([f"{n - unique} never reached the subscriber"] if unique < n else [])
                        + ([f"{duplicates} duplicate pushes"] if duplicates else []),
        }
        out(f"run {run}  claims: {n:,} due retries in {elapsed:.1f} s = "
            f"{figures['claims_per_s']:,.0f} claims+deliveries/s; CPU ms per 1000: "
            f"compensator {figures['compensator_cpu_ms_per_1k']:,.0f}, SecantusDB "
            f"{figures['mongo_cpu_ms_per_1k']:,.0f}; {unique:,} unique, {duplicates} "
            "duplicates")
        return figures

    # ---- phase 2: sweep -------------------------------------------------------------------

    async def _sweep_timings(self, store: MongoStore) -> dict[int, list[float]]:
        await store.ensure_indexes()
        settings = CompensatorSettings(sweep_after_s=600)
        sub = Subscription(destination="bench-sweep", name="s", url=HttpUrl(self.sub_url),
                           paused=False, updated_at=utcnow() - timedelta(hours=2))
        sweeper = Sweeper(DeliveryClaims(store, "bench"), PendingSweep(store), lambda: [sub],
                          settings)
        now = utcnow()
        hour_ago = now - timedelta(hours=1)
        old = [Envelope(message_id=uuid7(), destination=sub.destination, body=b"{}",
                        created_at=hour_ago) for _ in range(self.args.due)]
        await store.records.record_messages([(e, [sub.id]) for e in old])
        await store.db.pending_batches.update_many({}, {"$set": {"recorded_at": hour_ago}})
        due_batches = [b async for b in store.db.pending_batches.find({})]
        due_ids = [f"{e.message_id}|{sub.id}" for e in old]
        pending = 0
        timings: dict[int, list[float]] = {}
        for size in self.args.sizes:
            while pending < size:  # a backlog behind the dispatcher: recent, no outcome yet
                chunk = min(RECORD_BATCH, size - pending)
                envelopes = [Envelope(message_id=uuid7(), destination=sub.destination,
                                      body=b"{}", created_at=now) for _ in range(chunk)]
                await store.db.pending_batches.insert_one(
                    docs.pending_batch_doc(uuid7(), sub.id, envelopes, now))
                pending += chunk
                if pending % 50_000 == 0 or pending == size:
                    say(f"sweep: {pending:,}/{size:,} recent pending deliveries written")
            timings[size] = []
            for _ in range(SWEEP_TIMINGS):
                swept = await sweeper.sweep()
                if swept != self.args.due:
                    raise RuntimeError(f"a sweep at {size:,} swept {swept}, not "
                                       f"{self.args.due}")
                timings[size].append(sweeper.last_sweep_s or 0.0)
                # back to pending for the next timing
                await store.db.deliveries.delete_many({"_id": {"$in": due_ids}})
                await store.db.pending_batches.insert_many(due_batches)
            out(f"sweep  {size:>9,} pending + {self.args.due:,} due: "
                f"{cell(spread(timings[size]), '.3f')} s (min / median / max)")
        return timings

    def sweep(self) -> dict[int, list[float]]:
        return dict(self.run(self._sweep_timings))

    # ---- phase 3: scheduled deliveries waiting --------------------------------------------

    def scheduled(self) -> list[dict[str, float]]:
        return due_scan_runs(self.mongo_uri, self.args.scheduled_due,
                             self.args.scheduled_waiting, self.args.runs)


@dataclass
class Done:
    claims: list[dict[str, Any]] = field(default_factory=list)
    sweeps: dict[int, list[float]] = field(default_factory=dict)
    scheduled: list[dict[str, float]] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("compensator", __doc__, runs=3)
    parser.add_argument("--retries", type=int, default=100_000)
    parser.add_argument("--subscriptions", type=int, default=4)
    parser.add_argument("--compensators", type=int, default=1)
    parser.add_argument("--sizes", default="10000,100000,1000000",
                        help="recent pending deliveries beside the due ones, comma-separated")
    parser.add_argument("--due", type=int, default=1000, help="deliveries each sweep finds")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--scheduled-waiting", type=int, default=100_000,
                        help="scheduled deliveries due 1-30 days ahead in the scheduled phase "
                             "(0: no scheduled phase)")
    parser.add_argument("--scheduled-due", type=int, default=2000,
                        help="scheduled deliveries due now, claimed in the scheduled phase")
    parser.add_argument("--only-scheduled", action="store_true",
                        help="the scheduled phase alone (no claims or sweep phase)")
    args = cli.parse_quick(parser, argv,
                           "smoke check: 1 run of 5,000 retries; sizes 1,000 and 10,000; "
                           "10,000 scheduled waiting, 500 due",
                           runs=1, retries=5000, sizes="1000,10000", scheduled_waiting=10_000,
                           scheduled_due=500)
    args.sizes = sorted(int(s) for s in args.sizes.split(","))
    if min(args.runs, args.retries, args.subscriptions, args.compensators, args.due,
           args.scheduled_due, *args.sizes) < 1 or args.scheduled_waiting < 0:
        parser.error("counts must be positive")
    if args.only_scheduled and not args.scheduled_waiting:
        parser.error("--only-scheduled needs --scheduled-waiting above 0")
    return args


def _claims_report(runs: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    claims = spread([r["claims_per_s"] for r in runs])
    return ([f"claims + deliveries per second (min / median / max): {cell(claims, ',.0f')}"],
            {"claims_per_s": claims["median"], "claims_spread": claims, "runs": runs})


def _sweep_report(sweeps: dict[int, list[float]],
                  sizes: list[int]) -> tuple[list[str], dict[str, Any]]:
    sweep_s = {size: spread(t) for size, t in sweeps.items()}
    smallest, largest = sizes[0], sizes[-1]
    growth = sweep_s[largest]["median"] / sweep_s[smallest]["median"]
    lines = [f"sweep with {size:>9,} pending: {cell(s, '.3f')} s" for size, s in sweep_s.items()]
    lines.append(f"sweep time at {largest:,} ÷ at {smallest:,} pending: {growth:.2f}x "
                 f"(collection {largest / smallest:,.0f}x larger, due work the same)")
    return lines, {"sweep_s_by_size": {str(size): s["median"] for size, s in sweep_s.items()},
                   "sweep_growth": growth, "sweep_spread": sweep_s}


def _scheduled_report(runs: list[dict[str, float]],
                      args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    summary = due_scan_summary(runs)
    return (due_scan_lines(summary, args.scheduled_due, args.scheduled_waiting),
            {"scheduled_claim_ratio": summary["ratio"]["median"],
             "scheduled_idle_scan_ms": {"empty": summary["idle_scan_ms_empty"]["median"],
                                        "waiting": summary["idle_scan_ms_waiting"]["median"]},
             "scheduled_spread": summary, "scheduled_runs": runs})


def _headline(args: argparse.Namespace) -> str:
    scheduled = (f"{args.scheduled_due:,} due scheduled beside {args.scheduled_waiting:,} "
                 "waiting" if args.scheduled_waiting else "no scheduled phase")
    if args.only_scheduled:
        return f"compensator benchmark: {args.runs} run(s) of the scheduled phase: {scheduled}"
    sizes = ", ".join(f"{s:,}" for s in args.sizes)
    return (f"compensator benchmark: {args.runs} run(s) of {args.retries:,} due retries over "
            f"{args.subscriptions} subscriptions, {args.compensators} compensator(s); sweeps at "
            f"{sizes} pending + {args.due:,} due; {scheduled}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work(exits: contextlib.ExitStack) -> Done:
        bench = CompensatorBench(args, cli.scratch_dir(exits, "msgbus-compensator-bench-"), exits)
        done = Done()
        if args.only_scheduled:
            bench.start_mongo()
        else:
            bench.start()
            done.claims = [bench.claims(run) for run in range(1, args.runs + 1)]
            done.sweeps = bench.sweep()
        if args.scheduled_waiting:
            done.scheduled = bench.scheduled()
        return done

    def report(done: Done, began: float) -> int:
        lines: list[str] = []
        figures: dict[str, Any] = {"bench": "compensator"}
        for ran, make in ((done.claims, lambda: _claims_report(done.claims)),
                          (done.sweeps, lambda: _sweep_report(done.sweeps, args.sizes)),
                          (done.scheduled, lambda: _scheduled_report(done.scheduled, args))):
            if ran:
                more_lines, more_figures = make()
                lines += more_lines
                figures |= more_figures
        out_lines(lines)
        out(f"wall time {time.monotonic() - began:.0f} s")
        problems = [f"run {r['run']}: {p}" for r in done.claims for p in r["problems"]]
        out(json.dumps(figures | {"problems": problems, "config": {
            "runs": args.runs, "retries": args.retries, "subscriptions": args.subscriptions,
            "compensators": args.compensators, "due": args.due, "sizes": args.sizes,
            "scheduled_waiting": args.scheduled_waiting, "scheduled_due": args.scheduled_due,
            "only_scheduled": args.only_scheduled}}, separators=(",", ":"), default=str))
        return 1 if problems else 0

    return cli.run(_headline(args), work, report)


if __name__ == "__main__":
    sys.exit(main())
