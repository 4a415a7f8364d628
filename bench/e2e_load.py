"""Load generators of `python -m bench.e2e`, each run in a process of its own (a spawned
`ProcessPoolExecutor` worker) so that they never share a GIL with what they measure.

- `client_send`: the producer as applications run it. `MsgbusClient.send()` (the product's
  client library: LMDB spool, fsync, group commit, then the background resender's batched
  POSTs to the receiver) from `threads` threads, paced on the clock: message n is due at
  start + (n - first) / rate. Returns, per message number, the unix time at which its send()
  returned and its message id, and when the spool was empty again (every message accepted by
  the receiver).
- `paced_direct`: the baseline. The same bodies POSTed straight to the subscriber with aiohttp
  at the same pace: no spool, no receiver, no broker, no dispatcher.

Bodies are `bench.dispatch_load.body(n)`, which the subscriber (`bench.subscriber.Recorder`)
records by `n` with its arrival time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from msgbus_devtools.testkit.waiting import NotInTime, eventually

from bench.dispatch_load import body
from bench.load import client_session, own_cpu_s, pacer, post, run_loop

GROUP_COMMIT_MS = 2.0
SPOOL_POLL_S = 0.02


def client_send(receiver_url: str, api_key: str, spool_dir: str, destination: str, first: int,
                count: int, rate_per_s: float, threads: int, timeout_s: float) -> dict[str, Any]:
    """Process target: see the module doc. Gives up waiting for the spool to empty after
    `timeout_s` (and reports how many stayed)."""
    from msgbus_client import MsgbusClient

    returned_at: dict[int, float] = {}
    message_ids: dict[int, str] = {}
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    client = MsgbusClient(receiver_url, api_key, spool_dir=Path(spool_dir),
                          group_commit_ms=GROUP_COMMIT_MS, inline_send=False,
                          retry_base_s=0.05, retry_max_s=1.0)
    start = time.monotonic() + 0.05

    def sender(offset: int) -> None:
        for n in range(first + offset, first + count, threads):
            delay = start + (n - first) / rate_per_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                message_id = client.send(destination, body(n), biz_id=f"order-{n % 1000}")
            except Exception as exc:  # reported, not raised: the run goes on
                with lock:
                    errors[type(exc).__name__] += 1
                continue
            now = time.time()
            with lock:
                returned_at[n] = now
                message_ids[n] = message_id

    cpu0, started = own_cpu_s(), time.time()
    workers = [threading.Thread(target=sender, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    sent_by = time.time()
    with contextlib.suppress(NotInTime):  # what is left is reported: left_in_spool
        eventually(lambda: not client.spool.pending_count(), timeout_s, "the spool empty",
                   interval_s=SPOOL_POLL_S)
    spool_empty_at = time.time()
    left = client.close(timeout_s=5.0)
    return {"returned_at": returned_at, "message_ids": message_ids, "errors": dict(errors),
            "started": started, "sent_by": sent_by, "spool_empty_at": spool_empty_at,
            "left_in_spool": left, "cpu_s": own_cpu_s() - cpu0}


def paced_direct(url: str, first: int, count: int, rate_per_s: float,
                 concurrency: int) -> dict[str, Any]:
    """Process target: the direct-HTTP baseline (see the module doc)."""
    return dict(run_loop(_paced_direct(url, first, count, rate_per_s, concurrency)))


async def _paced_direct(url: str, first: int, count: int, rate_per_s: float,
                        concurrency: int) -> dict[str, Any]:
    numbers = iter(range(first, first + count))
    stats: Counter[str] = Counter()
    headers = {"content-type": "application/json"}
    pace = pacer(first, rate_per_s)

    async def poster(session: aiohttp.ClientSession) -> None:
        for n in numbers:
            await pace(n)
            status = await post(session, url, orjson.dumps(body(n)), headers, stats)
            if status is not None:
                stats["ok" if status == 200 else f"status:{status}"] += 1

    async with client_session(concurrency) as session:
        cpu0, started = own_cpu_s(), time.time()
        await asyncio.gather(*(poster(session) for _ in range(concurrency)))
        finished = time.time()
    return {"stats": dict(stats), "started": started, "finished": finished,
            "cpu_s": own_cpu_s() - cpu0}
