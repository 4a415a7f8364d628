"""The benchmark's load generator, run in a process of its own (multiprocessing, spawn) so that
it does not share the GIL with the bus.

`worker(conn)` is the process target: it takes jobs from a `multiprocessing` pipe, POSTs the
messages with aiohttp (C requests in flight) and sends back `("progress", accepted)` about once
a second, then `("done", result)`. `None` ends the process.

Each message is `{"message_id": <uuid7>, "body": {"sent_at": time.time(), "n": i}}`. A 429/503
or a connection error is retried (the protocol's "busy, retry later") up to `MAX_ATTEMPTS`
times, keeping the first `sent_at`, so a retry shows as latency. Sending stops at the job's
`deadline` (unix time), so a job never runs unbounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import orjson

from bench.load import client_session, post, run_loop
from msgbus.ids import uuid7

MAX_ATTEMPTS = 5
RETRY_STATUSES = {429, 503}


def worker(conn: Connection) -> None:
    """Process target: run jobs from `conn` until it sends None or closes. SIGINT is ignored
    (a Ctrl-C reaches the whole process group; the parent stops this process by its pid)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while (job := conn.recv()) is not None:
            conn.send(("done", run_loop(produce(conn, **job))))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        pass


async def produce(conn: Connection | None, *, url: str, api_key: str, start: int, count: int,
                  concurrency: int, deadline: float) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    numbers: Iterator[int] = iter(range(start, start + count))  # shared by all coroutines
    stats: Counter[str] = Counter()
    first_sent: list[float] = []

    async def one_message(session: aiohttp.ClientSession, n: int) -> None:
        sent_at = time.time()
        if not first_sent:
            first_sent.append(sent_at)
        data = orjson.dumps({"message_id": uuid7(), "body": {"sent_at": sent_at, "n": n}})
        for attempt in range(1, MAX_ATTEMPTS + 1):
            if attempt > 1:
                stats["retries"] += 1
                await asyncio.sleep(0.05 * 2**attempt)
            status = await post(session, url, data, headers, stats)
            if status is None:
                continue
            if 200 <= status < 300:
                stats["accepted"] += 1
                return
            stats[f"status:{status}"] += 1
            if status not in RETRY_STATUSES:
                break
        stats["failed"] += 1

    async def sender(session: aiohttp.ClientSession) -> None:
        for n in numbers:
            if time.time() > deadline:
                stats["not_sent"] += 1
                continue
            await one_message(session, n)

    async def report_progress() -> None:
        while conn is not None:
            await asyncio.sleep(1.0)
            conn.send(("progress", stats["accepted"]))

    async with client_session(concurrency) as session:
        progress = asyncio.create_task(report_progress())
        started = time.time()
        await asyncio.gather(*(sender(session) for _ in range(concurrency)))
        finished = time.time()
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await progress
    return {
        "accepted": stats.pop("accepted", 0),
        "failed": stats.pop("failed", 0),
        "not_sent": stats.pop("not_sent", 0),
        "retries": stats.pop("retries", 0),
        "problems": dict(stats),
        "started": started,
        "first_sent": first_sent[0] if first_sent else started,
        "accept_s": finished - started,
    }
