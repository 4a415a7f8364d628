"""What the benchmarks' load generators share (bench/producer.py, bench/dispatch_load.py,
bench/e2e_load.py): running a coroutine on uvloop when it is installed, one aiohttp session of
`concurrency` connections, one POST counted into a Counter when it fails, the pacing schedule
of a paced load, and this process's CPU seconds."""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import aiohttp

REQUEST_TIMEOUT_S = 10.0
PACE_START_S = 0.05  # the schedule's first message is due this long after it is set up

T = TypeVar("T")


def own_cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on a new uvloop loop (asyncio's own when uvloop is missing)."""
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def client_session(concurrency: int) -> aiohttp.ClientSession:
    """An aiohttp session of at most `concurrency` connections, `REQUEST_TIMEOUT_S` a request."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))


async def post(session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str],
               stats: Counter[str]) -> int | None:
    """POST `data` and read the answer: its status, or None when the request failed (a
    connection error or a timeout, counted in `stats` as "error:<exception name>")."""
    try:
        async with session.post(url, data=data, headers=headers) as response:
            await response.read()
            return response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        stats[f"error:{type(exc).__name__}"] += 1
        return None


def pacer(first: int, rate_per_s: float) -> Callable[[int], Awaitable[None]]:
    """A schedule on the running loop's clock: `await pace(n)` returns when message n is due,
    at start + (n - first) / rate_per_s (start: `PACE_START_S` from now). Shared by all the
    senders of one load, so that a slow answer does not hold back the next messages."""
    loop = asyncio.get_running_loop()
    t0 = loop.time() + PACE_START_S

    async def pace(n: int) -> None:
        delay = t0 + (n - first) / rate_per_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    return pace
