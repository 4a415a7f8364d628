"""Delayed delivery benchmark (issue 29 part 2): the compensator's due scan and claim with
nothing waiting, and with `--waiting` scheduled deliveries due far in the future.

    python -m bench.delays [--runs 3] [--waiting 300000] [--due 2000] [--quick]

On a SecantusDB of its own (127.0.0.1, stopped by PID at the end): one subscription gets `--due`
scheduled deliveries that are due now; `DeliveryClaims.claim_due` takes them all, 256 at a time,
as a compensator's retry loop does (the pushes themselves are not part of this figure), and the
time is taken. Then `--waiting` scheduled deliveries due 1 to 30 days ahead are added to the
same subscription, the due ones are put back, and the claims are timed again. The figure to
watch: the time with the waiting ones ÷ the time without (it should stay near 1: the scan reads
the (subscription, status, next_attempt_at) index up to now, never what waits beyond).
An idle scan (nothing due) is timed the same way. The lateness of delayed pushes (p50/p99) is
measured end to end by tests/integration/test_delays.py, which prints it per broker.

Per-run lines, a min/median/max table and, as the last line, one JSON object go to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
import time
from datetime import timedelta
from typing import Any

from msgbus_devtools import servers as services

from bench import cli
from bench.dispatch_stack import with_store
from bench.report import cell, out, say, spread
from msgbus.ids import uuid7
from msgbus.models import DeliveryStatus, utcnow
from msgbus.store import MongoStore
from msgbus.store.claims import DeliveryClaims

SUB = "bench-delays/sub"
CLAIM = 256
INSERT_CHUNK = 5000
IDLE_SCANS = 50


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
        await store.deliveries.insert_many(docs[start:start + INSERT_CHUNK], ordered=False)


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
    await store.deliveries.update_many(
        {"subscription": SUB, "lease": {"$exists": True}},
        {"$set": {"next_attempt_at": utcnow()}, "$unset": {"lease": ""}})


async def _run(store: MongoStore, args: argparse.Namespace) -> dict[str, Any]:
    await store.ensure_indexes()
    await store.deliveries.delete_many({"subscription": SUB})
    await _insert(store, [_scheduled_doc(-1.0) for _ in range(args.due)])
    empty_claim_s, empty_idle_s = await _claim_all(store, args.due)
    say(f"  {args.due:,} due, nothing waiting: claimed in {empty_claim_s:.3f} s")
    began = time.perf_counter()
    await _insert(store, [_scheduled_doc(86400 * (1 + 29 * i / args.waiting))
                          for i in range(args.waiting)])
    say(f"  {args.waiting:,} waiting inserted in {time.perf_counter() - began:.0f} s")
    await _make_due_again(store)
    full_claim_s, full_idle_s = await _claim_all(store, args.due)
    say(f"  {args.due:,} due, {args.waiting:,} waiting: claimed in {full_claim_s:.3f} s")
    return {"claim_s_empty": empty_claim_s, "claim_s_waiting": full_claim_s,
            "idle_scan_ms_empty": empty_idle_s * 1000, "idle_scan_ms_waiting": full_idle_s * 1000,
            "ratio": full_claim_s / empty_claim_s, "idle_ratio": full_idle_s / empty_idle_s}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("delays", __doc__, runs=3)
    parser.add_argument("--waiting", type=int, default=300_000)
    parser.add_argument("--due", type=int, default=2000)
    return cli.parse_quick(parser, argv, "smoke check: 1 run, 20,000 waiting, 500 due",
                           runs=1, waiting=20_000, due=500)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work(exits: contextlib.ExitStack) -> list[dict[str, Any]]:
        workdir = cli.scratch_dir(exits, "msgbus-delays-bench-")
        mongo = services.start_secantus(services.free_port(), workdir / "mongo",
                                        workdir / "logs")
        exits.callback(mongo.stop)
        runs = []
        for run in range(1, args.runs + 1):
            say(f"run {run}")
            db = f"bench_delays_{secrets.token_hex(3)}"
            runs.append(with_store(mongo.url, db, lambda s: _run(s, args)))
        return runs

    def report(runs: list[dict[str, Any]], began: float) -> int:
        figures = {key: spread([r[key] for r in runs]) for key in runs[0]}
        out()
        out(f"claim of {args.due:,} due, nothing waiting (s): "
            f"{cell(figures['claim_s_empty'], '.3f')}")
        out(f"claim of {args.due:,} due, {args.waiting:,} waiting (s): "
            f"{cell(figures['claim_s_waiting'], '.3f')}")
        out(f"ratio waiting / nothing waiting: {cell(figures['ratio'], '.2f')}")
        out(f"idle scan, nothing waiting / {args.waiting:,} waiting (ms): "
            f"{cell(figures['idle_scan_ms_empty'], '.2f')} / "
            f"{cell(figures['idle_scan_ms_waiting'], '.2f')}")
        out(f"wall time {time.monotonic() - began:.0f} s")
        out(json.dumps({"bench": "delays", "figures": figures, "runs": runs,
                        "config": {"waiting": args.waiting, "due": args.due}},
                       separators=(",", ":"), default=str))
        return 0

    return cli.run(f"delays benchmark: {args.runs} run(s), {args.due:,} due beside "
                   f"{args.waiting:,} waiting scheduled deliveries", work, report)


if __name__ == "__main__":
    sys.exit(main())
