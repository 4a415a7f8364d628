"""What each message's MongoDB records cost the MongoDB-protocol server (issue 10's throughput
goal is "with MongoDB records").

    python -m bench.mongo_writes [--runs 3] [--messages 5000] [--quick]

Starts SecantusDB on a free port in a temp dir (stopped by PID at the end) and, per run, makes
the bus's own writes for `--messages` new messages with one subscription each, through the
product's `MongoStore`, in the batch sizes the services use:

- the receiver's record: `record_messages` (the messages and their pending batch), 500 a batch;
- the dispatcher's trace: `record_outcomes` (an attempt and the delivered state inserted), 1,000
  a batch; and, to split it, the attempt inserts alone on another set of messages;
- the compensator's sweep of the pending batches, which finds every message delivered
  (`PendingSweep`, pages of 50 batches);
- every record of new messages by 4 clients at once (as receivers and dispatchers write them),
  then their settling: the most messages per second the server records, and the cores it uses
  for that (SecantusDB: one, whatever the number of clients);
- the baselines, in the same run: `insert_many` of as many small documents into a collection
  without secondary indexes, then one update by _id of each (`bulk_write`), which is the floor
  of any delivery state change on this server.

Figures: the server's CPU milliseconds per message for each write (its CPU seconds from /proc ÷
messages), the writes per second, each against the baseline as a ratio, and the server cores a
sustained 2,000 messages/s would need for all of it. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

from msgbus_devtools import servers as services
from pymongo import UpdateOne

from bench import cli
from bench.procs import process_cpu_s
from bench.report import cell, out, rounded, say, spread
from msgbus.ids import uuid7
from msgbus.models import AttemptResult, DeliveryOutcome, Envelope, utcnow
from msgbus.store import MongoStore
from msgbus.store.documents import attempt_doc
from msgbus.store.idsets import chunked
from msgbus.store.pending import PendingSweep

RECORD_BATCH = 500  # the receiver's record batch
TRACE_BATCH = 1000  # the dispatcher's trace batch (MSGBUS_DISPATCHER_TRACE_BATCH_SIZE)
SUBSCRIPTION = "bench/a"
TARGET_MSGS_PER_S = 2000
SETTLE_PAGE = 50  # the compensator's page of pending batches
PARALLEL_WRITERS = 4
WRITES = ("baseline_insert", "baseline_update", "receiver_record", "dispatcher_trace",
          "compensator_settle", "attempt_insert", "all_in_parallel")
BUS_WRITES = ("receiver_record", "dispatcher_trace", "compensator_settle")


def new_envelopes(count: int) -> list[Envelope]:
    now = utcnow()
    return [Envelope(message_id=uuid7(), destination="bench", body=b'{"order": 12345}',
                     created_at=now, received_at=now) for _ in range(count)]


def delivered(envelope: Envelope) -> DeliveryOutcome:
    result = AttemptResult(message_id=envelope.message_id, subscription=SUBSCRIPTION,
                           attempt=1, started_at=utcnow(), latency_ms=1.2, status_code=200,
                           instance="bench")
    return DeliveryOutcome(result=result, destination=envelope.destination,
                           created_at=envelope.created_at)


class MongoWritesBench:
    def __init__(self, store: MongoStore, server_pid: int, messages: int) -> None:
        self.store = store
        self.pid = server_pid
        self.messages = messages

    async def measure(self, batches: list[Callable[[], Awaitable[object]]]
                      ) -> tuple[float, float]:
        """(server CPU ms per message, messages per second) of running `batches` in turn."""
        cpu0, t0 = process_cpu_s(self.pid), time.perf_counter()
        for batch in batches:
            await batch()
        cpu, wall = process_cpu_s(self.pid) - cpu0, time.perf_counter() - t0
        return cpu * 1000 / self.messages, self.messages / wall

    async def settle(self) -> None:
        sweep, now = PendingSweep(self.store), utcnow()
        while True:
            done = await sweep.run(SUBSCRIPTION, settle_before=now + timedelta(seconds=1),
                                   sweep_before=now - timedelta(days=1), limit=SETTLE_PAGE)
            if done.swept or done.reached_dispatcher:
                raise RuntimeError("the sweep found messages without an outcome")
            if done.batches < SETTLE_PAGE:
                return

    async def in_parallel(self) -> None:
        """Every record of new messages, by `PARALLEL_WRITERS` clients at once (as receivers
        and dispatchers write them), then the settling of their pending batches: the most
        records per second the server makes, whatever its clients."""
        async def one_writer(envelopes: list[Envelope]) -> None:
            for chunk in chunked(envelopes, RECORD_BATCH):
                await self.store.records.record_messages([(e, [SUBSCRIPTION]) for e in chunk])
            for chunk in chunked(envelopes, TRACE_BATCH):
                await self.store.records.record_outcomes([delivered(e) for e in chunk])

        share = self.messages // PARALLEL_WRITERS
        await asyncio.gather(*(one_writer(new_envelopes(share))
                               for _ in range(PARALLEL_WRITERS)))
        await self.settle()

    async def run(self) -> dict[str, tuple[float, float]]:
        store, n = self.store, self.messages
        baseline = store.db[f"bench_baseline_{uuid7()}"]
        envelopes, others = new_envelopes(n), new_envelopes(n)
        figures = {"baseline_insert": await self.measure([
            partial(baseline.insert_many, [{"_id": e.message_id, "at": e.created_at, "n": 1}
                                           for e in chunk])
            for chunk in chunked(envelopes, RECORD_BATCH)])}
        now = utcnow()
        figures["baseline_update"] = await self.measure([
            partial(baseline.bulk_write, [UpdateOne(
                {"_id": e.message_id}, {"$set": {"status": "delivered", "at": now},
                                        "$inc": {"n": 1}}) for e in chunk], ordered=False)
            for chunk in chunked(envelopes, TRACE_BATCH)])
        figures["receiver_record"] = await self.measure([
            partial(store.record_messages, [(e, [SUBSCRIPTION]) for e in chunk])
            for chunk in chunked(envelopes, RECORD_BATCH)])
        figures["dispatcher_trace"] = await self.measure([
            partial(store.record_outcomes, [delivered(e) for e in chunk])
            for chunk in chunked(envelopes, TRACE_BATCH)])
        figures["compensator_settle"] = await self.measure([self.settle])
        figures["attempt_insert"] = await self.measure([
            partial(store.db.attempts.insert_many, [attempt_doc(delivered(e).result)
                                                    for e in chunk])
            for chunk in chunked(others, TRACE_BATCH)])
        figures["all_in_parallel"] = await self.measure([self.in_parallel])
        await baseline.drop()
        return figures


def report(runs: list[dict[str, tuple[float, float]]]) -> dict[str, object]:
    cpu = {w: spread([r[w][0] for r in runs]) for w in WRITES}
    rate = {w: spread([r[w][1] for r in runs]) for w in WRITES}
    per_message = spread([sum(r[w][0] for w in BUS_WRITES) for r in runs])
    update = spread([r["dispatcher_trace"][0] - r["attempt_insert"][0] for r in runs])
    ratio = {w: spread([r[w][0] / r["baseline_insert"][0] for r in runs]) for w in WRITES}
    out(f"{'write (per message)':34} {'server CPU ms':>22} {'x baseline':>22} "
        f"{'msg/s':>24}")
    for w in WRITES:
        out(f"{w:34} {cell(cpu[w], '.3f'):>22} {cell(ratio[w], '.1f'):>22} "
            f"{cell(rate[w], ',.0f'):>24}")
    out(f"{'  of which the delivery state':34} {cell(update, '.3f'):>22}")
    out(f"{'all of one message':34} {cell(per_message, '.3f'):>22}")
    cores = {k: v * TARGET_MSGS_PER_S / 1000 for k, v in per_message.items()}
    out(f"server cores for {TARGET_MSGS_PER_S:,} msg/s with their records: "
        f"{cell(cores, '.2f')} (min / median / max)")
    used = spread([r["all_in_parallel"][0] * r["all_in_parallel"][1] / 1000 for r in runs])
    out(f"server cores used by {PARALLEL_WRITERS} writers at once: {cell(used, '.2f')}, for "
        f"{cell(rate['all_in_parallel'], ',.0f')} messages/s with all their records")
    return {"bench": "mongo_writes", "runs": len(runs),
            "cpu_ms_per_message": {w: rounded(cpu[w]) for w in WRITES},
            "delivery_state_cpu_ms": rounded(update),
            "all_cpu_ms_per_message": rounded(per_message),
            "ratio_to_baseline": {w: rounded(ratio[w]) for w in WRITES},
            "msgs_per_s": {w: rounded(rate[w]) for w in WRITES},
            f"server_cores_for_{TARGET_MSGS_PER_S}_per_s": rounded(cores),
            "server_cores_in_parallel": rounded(used)}


async def bench(args: argparse.Namespace, url: str,
                pid: int) -> list[dict[str, tuple[float, float]]]:
    store = MongoStore(url, f"bench_writes_{uuid7().replace('-', '')[:12]}")
    try:
        await store.ensure_indexes()
        runs = []
        for run in range(1, args.runs + 1):
            say(f"run {run}/{args.runs}: {args.messages:,} messages: the bus's writes and two "
                "baselines")
            figures = await MongoWritesBench(store, pid, args.messages).run()
            say(f"run {run}: " + ", ".join(f"{w} {figures[w][0]:.3f} ms"
                                            for w in WRITES))
            runs.append(figures)
        return runs
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser("mongo_writes", __doc__, runs=3)
    parser.add_argument("--messages", type=int, default=5000)
    args = cli.parse_quick(parser, argv, "1 run of 1,000 messages", runs=1, messages=1000)
    with tempfile.TemporaryDirectory(prefix="msgbus-mongo-writes-") as tmp:
        server = services.start_secantus(services.free_port(), Path(tmp) / "db", Path(tmp))
        try:
            runs = asyncio.run(bench(args, server.url, server.pid))
        finally:
            server.stop()
    out(json.dumps(report(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
