"""Load generators of `python -m bench.dispatch`, run in a process of their own (a spawned
`ProcessPoolExecutor` worker) so that they never share a GIL with what they measure.

- `raw_push`: the baseline. POSTs `count` message bodies straight to a subscriber URL with
  aiohttp, `concurrency` requests in flight (the subscription's `max_concurrency`), as fast as
  the subscriber answers: what one process can push with no broker, no trace and no bus.
- `paced_send`: single-message POSTs to the receiver at `rate_per_s` (a schedule on the clock:
  message i is due at start + i / rate; up to `concurrency` in flight, so a slow answer does
  not hold back the next ones). Returns, per message number, the unix time at which its 202
  arrived: the moment the receiver accepted it.

Message bodies are `body(n)`: `{"sent_at": <unix time>, "n": n, "pad": ...}` (~200 bytes, a
typical message), which `bench.subscriber.Recorder` records by `n`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson

from bench.load import client_session, own_cpu_s, pacer, post, run_loop
from msgbus.ids import uuid7

PAD = "a benchmark message of typical size " * 4


def body(n: int, sent_at: float | None = None) -> dict[str, Any]:
    return {"sent_at": time.time() if sent_at is None else sent_at, "n": n, "pad": PAD}


def raw_push(url: str, start: int, count: int, concurrency: int,
             deadline: float) -> dict[str, Any]:
    """Process target: the raw aiohttp push loop. Stops sending at `deadline` (unix time)."""
    return dict(run_loop(_raw_push(url, start, count, concurrency, deadline)))


async def _raw_push(url: str, start: int, count: int, concurrency: int,
                    deadline: float) -> dict[str, Any]:
    numbers: Iterator[int] = iter(range(start, start + count))
    stats: Counter[str] = Counter()
    headers = {"content-type": "application/json"}

    async def pusher(session: aiohttp.ClientSession) -> None:
        for n in numbers:
            if time.time() > deadline:
                stats["not_sent"] += 1
                continue
            try:
                async with session.post(url, data=orjson.dumps(body(n)),
                                        headers=headers) as response:
                    await response.read()
                    stats["ok" if 200 <= response.status < 300 else "failed"] += 1
            except (aiohttp.ClientError, TimeoutError):
                stats["failed"] += 1

    async with client_session(concurrency) as session:
        cpu0, started = own_cpu_s(), time.time()
        await asyncio.gather(*(pusher(session) for _ in range(concurrency)))
        finished, cpu1 = time.time(), own_cpu_s()
    return {"ok": stats["ok"], "failed": stats["failed"], "not_sent": stats["not_sent"],
            "started": started, "finished": finished, "cpu_s": cpu1 - cpu0}


def paced_send(url: str, api_key: str, start: int, count: int, rate_per_s: float,
               concurrency: int, deadline: float) -> dict[str, Any]:
    """Process target: paced single-message POSTs to the receiver (see the module doc)."""
    return dict(run_loop(_paced_send(url, api_key, start, count, rate_per_s, concurrency,
                                 deadline)))


async def _paced_send(url: str, api_key: str, start: int, count: int, rate_per_s: float,
                      concurrency: int, deadline: float) -> dict[str, Any]:
    numbers: Iterator[int] = iter(range(start, start + count))
    accepted_at: dict[int, float] = {}
    answer_ms: list[float] = []
    stats: Counter[str] = Counter()
    headers = {"content-type": "application/json", "authorization": f"Bearer {api_key}"}
    pace = pacer(start, rate_per_s)

    async def sender(session: aiohttp.ClientSession) -> None:
        for n in numbers:
            await pace(n)
            if time.time() > deadline:
                stats["not_sent"] += 1
                continue
            sent_at = time.time()
            data = orjson.dumps({"message_id": uuid7(), "body": body(n, sent_at)})
            status = await post(session, url, data, headers, stats)
            if status is None:
                continue
            now = time.time()
            if status == 202:
                accepted_at[n] = now
                answer_ms.append((now - sent_at) * 1000)
            else:
                stats[f"status:{status}"] += 1

    async with client_session(concurrency) as session:
        started = time.time()
        await asyncio.gather(*(sender(session) for _ in range(concurrency)))
        finished = time.time()
    return {"accepted_at": accepted_at, "answer_ms": answer_ms, "problems": dict(stats),
            "started": started, "finished": finished}
