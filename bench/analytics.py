"""Analytics benchmark (issue 8): rows/s of the MongoDB data source, and the time of the
statistics job over MongoDB against the same job over a Parquet copy of the same records.

    python -m bench.analytics [--deliveries 1000000] [--runs 3] [--master local[*]]
                              [--partitions 0] [--quick]

Everything runs on 127.0.0.1: a SecantusDB of its own (free port, temporary directory), stopped
by PID at the end, also on Ctrl-C, SIGTERM or an error; Spark in this process.

1. seed: `--deliveries` deliveries (two destinations of four subscriptions each, so a quarter
   as many messages; about one attempt per delivery) straight into MongoDB in the product's
   document shapes (msgbus_devtools/testkit/analytics_seed.py); then the product's indexes on
   the time fields the reads use (messages.created_at, deliveries.created_at, attempts.started_at).
2. copy: the three collections read once through the data source and written as Parquet in
   the archive's layout (date, destination partitions).
3. per run (interleaved, so machine noise hits each alike):
   - source: the deliveries read through the data source (statistics columns) into Spark's
     `noop` sink: source_rows_per_s = deliveries / time; again in one time slice
     (source_rows_per_s_1_slice): SecantusDB serves one query at a time, so parallel slices
     compete for it here, where a MongoDB server would serve them in parallel;
   - server: the same query with pymongo alone, one cursor, no Spark (what the MongoDB server
     itself delivers: the ceiling of the source on this server);
   - stats over MongoDB and stats over the Parquet copy (`analytics.stats_job.run_stats`, no
     files written): stats_s_mongo, stats_s_parquet.
A warm-up stats run over the Parquet copy (not reported) absorbs Spark's first-job costs.
Progress goes to stderr; per-run lines, a min/median/max table and, as the last line, one JSON
object go to stdout.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from msgbus_devtools import servers as services
from msgbus_devtools.testkit import analytics_seed as seed
from pymongo import MongoClient

from analytics.mongo_source import read_collection
from analytics.schemas import DELIVERIES_STATS
from analytics.session import build_spark, mongo_location
from analytics.settings import AnalyticsSettings
from analytics.stats_job import run_stats
from bench.report import cell, out, say, spread
from msgbus.store.indexes import INDEXES

DATABASE = "bench_analytics"
START = datetime(2026, 3, 1, tzinfo=UTC)
SPAN = timedelta(days=2)
SUBSCRIPTIONS = ["billing", "shipping", "mailer", "search"]
SEED_CHUNK = 5000
FIGURES = ("source_rows_per_s", "source_rows_per_s_1_slice", "server_docs_per_s",
           "stats_s_mongo", "stats_s_parquet", "ratio")


def seed_mongo(uri: str, deliveries: int) -> dict[str, int]:
    plan = seed.SeedPlan(START, SPAN, messages=max(1, deliveries // len(SUBSCRIPTIONS)),
                         destinations={"orders": SUBSCRIPTIONS, "users": SUBSCRIPTIONS})
    totals = {"messages": 0, "deliveries": 0, "attempts": 0}
    started = last = time.monotonic()
    for records in seed.chunks(plan, SEED_CHUNK):
        seed.insert(uri, DATABASE, records)
        for name in totals:
            totals[name] += len(getattr(records, name))
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            rate = sum(totals.values()) / (last - started)
            say(f"seeding: {totals['deliveries']:,}/{deliveries:,} deliveries, "
                f"{rate:,.0f} docs/s")
    say(f"seeded {totals} in {time.monotonic() - started:.0f} s; building the time indexes")
    # after the inserts, and only those the analytics reads use: SecantusDB inserts ~15k
    # docs/s without secondary indexes and ~3.4k/s with the product's eleven
    started = time.monotonic()
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        for collection, indexes in INDEXES.items():
            for index in indexes:
                keys = list(index.document["key"])
                if keys in (["created_at"], ["started_at"]):
                    client[DATABASE][collection].create_indexes([index])
    finally:
        client.close()
    say(f"indexes built in {time.monotonic() - started:.0f} s")
    return totals


def parquet_copy(spark: Any, settings: AnalyticsSettings, archive_dir: Path) -> None:
    from pyspark.sql import functions as F

    location = mongo_location(spark, settings)
    for collection, time_field in (("messages", "created_at"), ("deliveries", "created_at"),
                                   ("attempts", "started_at")):
        started = time.monotonic()
        frame = read_collection(spark, location, collection, START, START + SPAN)
        frame = frame.withColumn("date", F.to_date(time_field))
        if collection == "attempts":
            frame = frame.withColumn("destination",
                                     F.split_part("subscription", F.lit("/"), F.lit(1)))
        (frame.write.partitionBy("date", "destination").mode("overwrite")
         .parquet(str(archive_dir / collection)))
        say(f"parquet copy of {collection}: {time.monotonic() - started:.1f} s")


def source_rows_per_s(spark: Any, settings: AnalyticsSettings, expected: int) -> float:
    location = mongo_location(spark, settings)
    say(f"source: deliveries in {location.partitions} time slices")
    frame = read_collection(spark, location, "deliveries", START, START + SPAN, DELIVERIES_STATS)
    started = time.monotonic()
    frame.write.format("noop").mode("overwrite").save()
    elapsed = time.monotonic() - started
    counted = read_collection(spark, location, "deliveries", START, START + SPAN,
                              DELIVERIES_STATS).count()
    if counted != expected:
        raise RuntimeError(f"the source read {counted} deliveries, {expected} were seeded")
    return expected / elapsed


def server_docs_per_s(uri: str) -> float:
    """The same query and projection as the source, one pymongo cursor, no Spark."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        query = {"created_at": {"$gte": START, "$lt": START + SPAN}}
        projection = dict.fromkeys(DELIVERIES_STATS.fieldNames(), 1)
        started = time.monotonic()
        count = sum(1 for _ in client[DATABASE].deliveries.find(query, projection,
                                                                batch_size=10_000))
        return count / (time.monotonic() - started)
    finally:
        client.close()


def timed_stats(spark: Any, settings: AnalyticsSettings, source: str) -> float:
    started = time.monotonic()
    run_stats(spark, settings, START, START + SPAN, source=source)  # type: ignore[arg-type]
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deliveries", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--partitions", type=int, default=0,
                        help="time slices per MongoDB read (0: Spark's cores)")
    parser.add_argument("--quick", action="store_true", help="40,000 deliveries, 1 run")
    args = parser.parse_args()
    if args.quick:
        args.deliveries, args.runs = 40_000, 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="bench-analytics-"))
    with contextlib.ExitStack() as exits:
        exits.callback(shutil.rmtree, workdir, ignore_errors=True)
        mongo = services.start_secantus(services.free_port(), workdir / "mongo", workdir)
        exits.callback(mongo.stop)
        seeded = seed_mongo(mongo.url, args.deliveries)
        settings = AnalyticsSettings(mongo_uri=mongo.url, mongo_db=DATABASE,
                                     master=args.master, read_partitions=args.partitions,
                                     archive_dir=workdir / "parquet")
        spark = build_spark(settings)
        exits.callback(spark.stop)
        parquet_copy(spark, settings, settings.archive_dir)
        say("warm-up: stats over the Parquet copy (not reported)")
        timed_stats(spark, settings, "archive")
        runs: list[dict[str, float]] = []
        for run in range(1, args.runs + 1):
            one_slice = settings.model_copy(update={"read_partitions": 1})
            figures = {"source_rows_per_s": source_rows_per_s(spark, settings,
                                                              seeded["deliveries"]),
                       "source_rows_per_s_1_slice": source_rows_per_s(
                           spark, one_slice, seeded["deliveries"]),
                       "server_docs_per_s": server_docs_per_s(mongo.url),
                       "stats_s_mongo": timed_stats(spark, settings, "mongo"),
                       "stats_s_parquet": timed_stats(spark, settings, "archive")}
            figures["ratio"] = figures["stats_s_mongo"] / figures["stats_s_parquet"]
            runs.append(figures)
            out(f"run {run}: " + ", ".join(f"{k} {v:,.2f}" for k, v in figures.items()))
        summary = {name: spread([r[name] for r in runs]) for name in FIGURES}
        out(f"\n{args.deliveries:,} deliveries ({seeded}), master {args.master}, "
            f"min / median / max of {len(runs)} runs:")
        for name in FIGURES:
            out(f"  {name:<26} {cell(summary[name], ',.2f')}")
        out(json.dumps({
            "source_rows_per_s": summary["source_rows_per_s"]["median"],
            "stats_s_mongo": summary["stats_s_mongo"]["median"],
            "stats_s_parquet": summary["stats_s_parquet"]["median"],
            "source_rows_per_s_1_slice": summary["source_rows_per_s_1_slice"]["median"],
            "server_docs_per_s": summary["server_docs_per_s"]["median"],
            "read_partitions": mongo_location(spark, settings).partitions,
            "ratio_mongo_to_parquet": summary["ratio"]["median"],
            "deliveries": args.deliveries, "seeded": seeded, "master": args.master,
            "runs": runs, "spread": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
