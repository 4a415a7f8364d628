"""Admin page times on a seeded data set (issue 7): every page must stay fast with millions of
messages, because every page's query is index-backed and bounded.

    python -m bench.admin_pages [--messages 1000000] [--destinations 10] [--repeats 5] [--quick]

Starts SecantusDB and `msgbus admin` (the production entry point) on 127.0.0.1, seeds
`--messages` messages over `--destinations` destinations and the last 7 days (one subscription
each, one delivery and one push attempt per message: 97% delivered, 2% failed, 1% parked; 1,000
distinct biz ids per destination), then times each page `--repeats` times after one first
request and prints the first request's time and min / median / max ms of the others, per page.
Both are stopped by PID at the end (also on Ctrl-C or an error). The last line is one JSON
object with the medians (`page_ms`) and first-request times (`first_ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx
from msgbus_devtools import servers as services
from pydantic import HttpUrl

from bench import cli
from bench.dispatch_stack import wait_for
from bench.ingest_stack import stop_process
from bench.report import out, say
from msgbus.ids import uuid7
from msgbus.models import AttemptResult, BrokerKind, Destination, Envelope, Subscription, utcnow
from msgbus.store import MongoStore
from msgbus.store import documents as docs

CHUNK = 10_000
DAYS = 7


def _status(n: int) -> str:
    return "parked" if n % 100 == 0 else "failed" if n % 50 == 1 else "delivered"


def _attempt(envelope: Envelope, status: str) -> AttemptResult:
    ok = status == "delivered"
    return AttemptResult(
        message_id=envelope.message_id, subscription=f"{envelope.destination}/s", attempt=1,
        started_at=envelope.created_at + timedelta(milliseconds=30),
        status_code=200 if ok else 500, latency_ms=5.0 + len(envelope.message_id) % 7,
        instance="seed", answer=None if ok else '{"error": "database down"}')


async def seed(uri: str, db: str, messages: int, destinations: int) -> dict[str, Any]:
    """Returns a few ids and names the timed pages use."""
    store = MongoStore(uri, db)
    try:
        await store.ensure_indexes()
        codes = [f"seed-{i}" for i in range(destinations)]
        for code in codes:
            await store.save_destination(Destination(code=code, broker=BrokerKind.KAFKA))
            await store.save_subscription(Subscription(
                destination=code, name="s", url=HttpUrl("http://127.0.0.1:9/hook")))
        now = utcnow()
        step = timedelta(days=DAYS) / messages
        began = time.monotonic()
        last_id = ""
        for lo in range(0, messages, CHUNK):
            batch = []
            for n in range(lo, min(lo + CHUNK, messages)):
                code = codes[n % destinations]
                batch.append(Envelope(
                    message_id=uuid7(), destination=code, body=b'{"order": 1, "total": 42}',
                    biz_id=f"order-{code}-{n // destinations % 1000}", source_app="seed",
                    created_at=now - timedelta(days=DAYS) + n * step))
            await store.messages.insert_many(
                [docs.message_doc(e, [f"{e.destination}/s"]) for e in batch])
            await store.deliveries.insert_many([
                docs.delivery_doc(e, f"{e.destination}/s", now)
                | {"status": _status(n // destinations), "attempts": 1}
                for n, e in enumerate(batch, start=lo)])
            await store.attempts.insert_many([
                docs.attempt_doc(_attempt(e, _status(n // destinations)))
                for n, e in enumerate(batch, start=lo)])
            last_id = batch[-1].message_id
            done = min(lo + CHUNK, messages)
            if done % 100_000 == 0 or done == messages:
                rate = done / (time.monotonic() - began)
                say(f"seeded {done:,}/{messages:,} messages, deliveries and attempts "
                    f"({rate:,.0f}/s)")
        return {"code": codes[0], "biz_id": f"order-{codes[0]}-7", "message_id": last_id}
    finally:
        await store.close()


def pages(seeded: dict[str, Any]) -> dict[str, str]:
    code = seeded["code"]
    return {
        "dashboard": "/ui/dashboard",
        "destinations": "/ui/destinations",
        "messages, newest": "/ui/messages",
        "messages by destination": f"/ui/messages?destination={code}",
        "messages by biz_id": f"/ui/messages?biz_id={seeded['biz_id']}",
        "messages by subscription + failed": f"/ui/messages?subscription={code}/s&status=failed",
        "messages failed, every subscription": "/ui/messages?status=failed",
        "messages by biz_id + parked": f"/ui/messages?biz_id={seeded['biz_id']}&status=parked",
        "messages, a deep page (3 days back)": "/ui/messages?before="
                                               + quote((utcnow() - timedelta(days=3)).isoformat()),
        "subscription page": f"/ui/subscriptions/{code}/s",
        "messages by destination, a day back": f"/ui/messages?destination={code}&before="
                                               + quote((utcnow() - timedelta(days=1)).isoformat()),
        "message detail": f"/ui/messages/{seeded['message_id']}",
        "parked of a subscription": f"/ui/parked/{code}/s",
        "replays": "/ui/replays",
        "audit": "/ui/audit",
        "API /v1/messages?biz_id": f"/v1/messages?biz_id={seeded['biz_id']}",
    }


def time_pages(args: argparse.Namespace,
               exits: contextlib.ExitStack) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Start SecantusDB and the admin app (on `exits`), seed them, time every page: by page,
    the times of the repeats and of the first request, ms."""
    workdir = cli.scratch_dir(exits, "msgbus-admin-bench-")
    mongo = services.start_secantus(services.free_port(), workdir / "mongo", workdir)
    exits.callback(mongo.stop)
    db = f"bench_admin_{secrets.token_hex(3)}"
    seeded = asyncio.run(seed(mongo.url, db, args.messages, args.destinations))
    token, port = secrets.token_urlsafe(24), services.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSGBUS_")} | {
        "MSGBUS_MONGO_URI": mongo.url, "MSGBUS_MONGO_DB": db, "MSGBUS_ADMIN_TOKEN": token,
        "MSGBUS_ADMIN_PORT": str(port)}
    with open(workdir / "admin.log", "ab") as log:
        admin = subprocess.Popen(
            [sys.executable, "-m", "msgbus.cli", "admin", "--state-dir",
             str(workdir / "state")], env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
    exits.callback(stop_process, admin, "admin")
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=120,
                          headers={"authorization": f"Bearer {token}"})
    exits.callback(client.close)

    def up() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return client.get("/health").status_code == 200
        return False

    wait_for("admin start", up, 60)
    results: dict[str, list[float]] = {}
    cold: dict[str, float] = {}
    out(f"{'page':<40} {'first':>9}   {'then min / median / max ms':>30}")
    for label, path in pages(seeded).items():
        timings = []
        for i in range(args.repeats + 1):
            t0 = time.perf_counter()
            response = client.get(path)
            elapsed = (time.perf_counter() - t0) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"{label}: {path} answered {response.status_code}")
            if i:
                timings.append(elapsed)
            else:  # the first request fills caches (the dashboard's lasts 10 s)
                cold[label] = elapsed
        results[label] = timings
        out(f"{label:<40} {cold[label]:9.1f}   {min(timings):9.1f} / "
            f"{statistics.median(timings):9.1f} / {max(timings):9.1f}")
    return results, cold


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser("admin_pages", __doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--destinations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = cli.parse_quick(parser, argv, "50,000 messages, 3 repeats",
                           messages=50_000, repeats=3)

    def report(timed: tuple[dict[str, list[float]], dict[str, float]], began: float) -> int:
        results, cold = timed
        out(f"wall time {time.monotonic() - began:.0f} s")
        out(json.dumps({"bench": "admin_pages", "messages": args.messages,
                        "page_ms": {k: round(statistics.median(v), 1) for k, v in results.items()},
                        "first_ms": {k: round(v, 1) for k, v in cold.items()},
                        "spread_ms": {k: [round(min(v), 1), round(max(v), 1)]
                                      for k, v in results.items()}}, separators=(",", ":")))
        return 0

    return cli.run(f"admin page times: {args.messages:,} messages over {args.destinations} "
                   f"destinations and {DAYS} days; {args.repeats} timings per page",
                   functools.partial(time_pages, args), report)


if __name__ == "__main__":
    sys.exit(main())
