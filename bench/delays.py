"""Delayed delivery benchmark (issue 29 part 2): how late delayed pushes reach a subscriber
through the whole bus, and what the compensator's due scan costs beside many deliveries that
are scheduled far ahead.

    python -m bench.delays [--runs 3] [--messages 1000] [--max-delay-s 20]
                           [--waiting 300000] [--due 2000] [--no-lateness] [--no-scan] [--quick]

1. lateness (bench/delay_lateness.py; `--no-lateness` skips it): the whole bus as in bench.e2e
   (bench/dispatch_stack.py, `full=True`: `msgbus receiver`, `dispatcher` and `compensator`
   processes, tansu, SecantusDB, the machine's RabbitMQ), product settings. One destination
   per broker (Kafka, RabbitMQ, direct), each with one subscription to a recording subscriber
   (`msgbus_devtools.testkit.subscriber.RecordingSubscriber`, a real HTTP server in this
   process). After one warm-up message each, per run the client (`MsgbusClient.send(...,
   deliver_at=...)`) sends `--messages` per broker, interleaved, each due a random 0 to
   `--max-delay-s` seconds after its send; lateness = first arrival - due time
   (`msgbus_devtools.testkit.delays`). Per broker: p50 / p99 / max lateness, how many came
   early (must be 0), missing and duplicate pushes.
2. due scan (`--no-scan` skips it; `python -m bench.compensator --only-scheduled` runs the same
   functions): on a SecantusDB of its own, one subscription gets `--due` scheduled deliveries
   that are due now; `DeliveryClaims.claim_due` takes them all, 256 at a time, as a
   compensator's retry loop does (the pushes are not part of this figure), and the time is
   taken. Then `--waiting` scheduled deliveries due 1 to 30 days ahead are added to the same
   subscription, the due ones are put back, and the claims are timed again. The figure to
   watch: the time with the waiting ones ÷ the time without (it should stay near 1: the scan
   reads the (subscription, status, next_attempt_at) index up to now, never what waits
   beyond). An idle scan (nothing due) is timed the same way.

Progress goes to stderr; per-run lines, a min/median/max table and, as the last line, one JSON
object go to stdout. Problems (a push before its time, messages missing) make the exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import time
from datetime import timedelta
from typing import Any

from msgbus_devtools import servers as services

from bench import cli
from bench.delay_lateness import lateness_json, lateness_lines, lateness_runs
from bench.dispatch_stack import with_store
from bench.report import cell, out, out_json, out_lines, say, spread
from msgbus.ids import uuid7
from msgbus.models import DeliveryStatus, utcnow
from msgbus.store import MongoStore
from msgbus.store.claims import DeliveryClaims

SUB = "bench-delays/sub"
CLAIM = 256
INSERT_CHUNK = 5000
IDLE_SCANS = 50


# ---- due scan: what bench.compensator's scheduled phase runs too ---------------------------


def _scheduled_doc(due_in_s: float) -> dict[str, Any]:
    now = utcnow()
    message_id = uuid7()
    due = now + timedelta(seconds=due_in_s)
    return {"_id": f"{message_id}|{SUB}", "message_id": message_id, "subscription": SUB,
            "destination": "bench-delays", "biz_id": None,
            "status": DeliveryStatus.SCHEDULED.value, "attempts": 0, "created_at": now,
            "updated_at": now, "next_attempt_at": due, "scheduled_for": due}


async def _insert(store: MongoStore, docs: list[dict[str, Any]]) -> None:
    for start in range(0, len(docs), INSERT_CHUNK):
        await store.db.deliveries.insert_many(docs[start:start + INSERT_CHUNK], ordered=False)


async def _claim_all(store: MongoStore, due: int) -> tuple[float, float]:
    """Seconds to claim every due delivery (a fresh claimer, as a new compensator), and the
    mean seconds of an idle scan afterwards."""
    claims = DeliveryClaims(store, f"bench-{secrets.token_hex(3)}")
    began = time.perf_counter()
    taken = 0
    while taken < due:
        got = await claims.claim_due(SUB, CLAIM, lease_s=3600)
        if not got:
            raise RuntimeError(f"only {taken} of {due} due deliveries claimed")
        taken += len(got)
    claim_s = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(IDLE_SCANS):
        if await claims.claim_due(SUB, CLAIM, lease_s=3600):
            raise RuntimeError("an idle scan claimed something")
    return claim_s, (time.perf_counter() - began) / IDLE_SCANS


async def _make_due_again(store: MongoStore) -> None:
    await store.db.deliveries.update_many(
        {"subscription": SUB, "lease": {"$exists": True}},
        {"$set": {"next_attempt_at": utcnow()}, "$unset": {"lease": ""}})


async def due_scan(store: MongoStore, due: int, waiting: int) -> dict[str, float]:
    """One run of the due-scan measurement (see the module doc) in `store`'s database."""
    await store.ensure_indexes()
    await store.db.deliveries.delete_many({"subscription": SUB})
    await _insert(store, [_scheduled_doc(-1.0) for _ in range(due)])
    empty_claim_s, empty_idle_s = await _claim_all(store, due)
    say(f"  {due:,} due, nothing waiting: claimed in {empty_claim_s:.3f} s")
    began = time.perf_counter()
    await _insert(store, [_scheduled_doc(86400 * (1 + 29 * i / waiting))
                          for i in range(waiting)])
    say(f"  {waiting:,} waiting inserted in {time.perf_counter() - began:.0f} s")
    await _make_due_again(store)
    full_claim_s, full_idle_s = await _claim_all(store, due)
    say(f"  {due:,} due, {waiting:,} waiting: claimed in {full_claim_s:.3f} s")
    return {"claim_s_empty": empty_claim_s, "claim_s_waiting": full_claim_s,
            "idle_scan_ms_empty": empty_idle_s * 1000, "idle_scan_ms_waiting": full_idle_s * 1000,
            "ratio": full_claim_s / empty_claim_s, "idle_ratio": full_idle_s / empty_idle_s}


def due_scan_runs(mongo_uri: str, due: int, waiting: int, runs: int) -> list[dict[str, float]]:
    """`runs` due-scan measurements on that MongoDB server, each in a new database; each run's
    line printed as it ends."""
    done = []
    for run in range(1, runs + 1):
        say(f"due scan, run {run}: {due:,} due, {waiting:,} waiting")
        db = f"bench_delays_{secrets.token_hex(3)}"
        done.append(with_store(mongo_uri, db, lambda s: due_scan(s, due, waiting)))
        r = done[-1]
        out(f"run {run}  due scan: claim {r['claim_s_empty']:.3f} s alone, "
            f"{r['claim_s_waiting']:.3f} s beside {waiting:,} waiting (ratio {r['ratio']:.2f}); "
            f"idle scan {r['idle_scan_ms_empty']:.2f} / {r['idle_scan_ms_waiting']:.2f} ms")
    return done


def due_scan_summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {key: spread([r[key] for r in runs]) for key in runs[0]}


def due_scan_lines(figures: dict[str, dict[str, float]], due: int, waiting: int) -> list[str]:
    """The due scan's table (min / median / max) from `due_scan_summary`."""
    return [
        f"claim of {due:,} due scheduled, nothing waiting (s): "
        f"{cell(figures['claim_s_empty'], '.3f')}",
        f"claim of {due:,} due scheduled, {waiting:,} waiting (s): "
        f"{cell(figures['claim_s_waiting'], '.3f')}",
        f"claim time with {waiting:,} waiting ÷ without: {cell(figures['ratio'], '.2f')}",
        f"idle scan (ms), nothing waiting: {cell(figures['idle_scan_ms_empty'], '.2f')}; "
        f"{waiting:,} waiting: {cell(figures['idle_scan_ms_waiting'], '.2f')}",
    ]


# ---- the command ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("delays", __doc__, runs=3)
    parser.add_argument("--messages", type=int, default=1000,
                        help="delayed messages per broker and run (lateness phase)")
    parser.add_argument("--max-delay-s", type=float, default=20.0,
                        help="delays are random, 0 to this many seconds")
    parser.add_argument("--lateness", action=argparse.BooleanOptionalAction, default=True,
                        help="the lateness phase (default on)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds past the longest delay to wait for the last pushes")
    parser.add_argument("--waiting", type=int, default=300_000,
                        help="scheduled deliveries due 1-30 days ahead (due-scan phase)")
    parser.add_argument("--due", type=int, default=2000,
                        help="scheduled deliveries due now (due-scan phase)")
    parser.add_argument("--scan", action=argparse.BooleanOptionalAction, default=True,
                        help="the due-scan phase (default on)")
    args = cli.parse_quick(
        parser, argv, "smoke check: 1 run; 100 messages per broker delayed 0-5 s; "
        "20,000 waiting, 500 due", runs=1, messages=100, max_delay_s=5.0, waiting=20_000,
        due=500)
    if min(args.runs, args.messages, args.waiting, args.due) < 1 or args.max_delay_s < 0:
        parser.error("counts must be positive and --max-delay-s not negative")
    if not (args.lateness or args.scan):
        parser.error("--no-lateness and --no-scan leave nothing to run")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work(exits: contextlib.ExitStack) -> dict[str, Any]:
        workdir = cli.scratch_dir(exits, "msgbus-delays-bench-")
        done: dict[str, Any] = {}
        if args.lateness:
            with contextlib.ExitStack() as bus:  # stopped before the scan phase starts
                done["lateness"] = lateness_runs(args, workdir / "bus", bus)
        if args.scan:
            mongo = services.start_secantus(services.free_port(), workdir / "mongo",
                                            workdir / "logs")
            exits.callback(mongo.stop)
            done["scan"] = due_scan_runs(mongo.url, args.due, args.waiting, args.runs)
        return done

    def report(done: dict[str, Any], began: float) -> int:
        figures: dict[str, Any] = {"bench": "delays"}
        problems: list[str] = []
        if "lateness" in done:
            out_lines(lateness_lines(done["lateness"]))
            figures["lateness"], problems = lateness_json(done["lateness"])
        if "scan" in done:
            scan = due_scan_summary(done["scan"])
            out_lines(due_scan_lines(scan, args.due, args.waiting))
            figures |= {"scan_ratio": scan["ratio"]["median"], "scan": scan,
                        "scan_runs": done["scan"]}
        out(f"wall time {time.monotonic() - began:.0f} s")
        out_json(figures | {"problems": problems, "config": vars(args)})
        return 1 if problems else 0

    phases = ([f"lateness of {args.messages:,} messages per broker delayed 0-"
               f"{args.max_delay_s:g} s"] if args.lateness else []) + (
        [f"due scan of {args.due:,} due beside {args.waiting:,} waiting"] if args.scan else [])
    return cli.run(f"delays benchmark: {args.runs} run(s) of {'; '.join(phases)}", work, report)


if __name__ == "__main__":
    sys.exit(main())
