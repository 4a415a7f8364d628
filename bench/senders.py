"""Subscriber pushes, side by side: `H1Sender` against `AiohttpSender`, and both against a raw
aiohttp push loop (the baseline: what aiohttp itself does with no sender around it).

    python -m bench.senders [--runs 3] [--seconds 5] [--concurrency 64] [--warmup-s 1]

- One recording subscriber (`bench/subscriber.py`, raw ASGI under uvicorn and uvloop) runs in a
  process of its own on 127.0.0.1 and answers 200 to every push.
- **Each phase (one target, one run) runs in a fresh spawned process**: the sender never shares a
  GIL or a core with the subscriber (the machine has 2 cores: one each), no target inherits
  another's pool, connections or garbage, and every target starts from the same state. The
  phase process uses asyncio's own loop, as `msgbus dispatcher` does.
- A phase keeps `--concurrency` pushes in flight for `--warmup-s` (connections open, not counted)
  plus `--seconds` (measured): pushes/s is the pushes that *finished* in the measured window ÷ its
  length; latency p50/p99 is over those pushes; CPU is the phase process's user+system time in
  the window, so pushes per CPU-second is the per-core figure even when the process is not
  saturated (with 2 cores shared by sender and subscriber, it is the one to compare).
- `--uvloop` runs the phases on uvloop instead (the subscriber always uses it).
- Targets (`--targets`): `raw` posts the same bodies with `session.post` and only a
  content-type header; `aiohttp` and `h1` call `Sender.push` with an `Envelope` and
  `Subscription` as the dispatcher does (signed CloudEvents headers, per-subscription timeout,
  an AttemptResult).
- Runs are interleaved and the order rotates per run (raw, aiohttp, h1; then aiohttp, h1,
  raw; ...), so machine noise and position effects hit every target alike. Ratios
  against raw are paired with the raw phase of the same run.
- After each phase the subscriber is asked how many distinct messages it got; fewer than the
  phase's successful pushes is reported as lost (and the exit code is 1).

Progress goes to stderr; the table (min / median / max over runs) to stdout; the last stdout line
is one JSON object with the medians. Bounded in time (each phase is stopped at most 30 s after
its end) and it stops every process it started by its PID, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import multiprocessing
import signal
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

import orjson

from bench import cli
from bench.load import own_cpu_s
from bench.pipeline import figures_of, start_subscriber, stop_process
from bench.report import cell, out, out_json, out_lines, say, spread
from msgbus.percentiles import nearest_rank

HOST = "127.0.0.1"
TARGETS = ("raw", "aiohttp", "h1")
BASELINE = "raw"
PHASE_GRACE_S = 30.0
PAD = "a benchmark message of typical size " * 4  # bodies of ~200 bytes, as bench.dispatch_load


# ---- one phase, in its own process ---------------------------------------------------------------


def phase_worker(conn: Connection, target: str, url: str, concurrency: int, warmup_s: float,
                 seconds: float, use_uvloop: bool) -> None:
    """Process target: run one phase and send its figures back on `conn`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us by pid
    factory: Any = None
    if use_uvloop:
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        conn.send(runner.run(_phase(target, url, concurrency, warmup_s, seconds)))
    conn.close()


async def _phase(target: str, url: str, concurrency: int, warmup_s: float,
                 seconds: float) -> dict[str, Any]:
    push, close = await _pusher(target, url, concurrency)
    numbers = itertools.count()
    latencies_ms: list[float] = []
    stats: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    window_start = loop.time() + warmup_s
    window_end = window_start + seconds
    cpu: dict[str, float] = {}

    async def worker() -> None:
        while loop.time() < window_end:
            n = next(numbers)
            body = orjson.dumps({"sent_at": time.time(), "n": n, "pad": PAD})
            t0 = loop.time()
            error = await push(n, body)
            t1 = loop.time()
            stats["ok" if error is None else error[:60]] += 1
            if window_start <= t1 < window_end:
                if error is None:
                    latencies_ms.append((t1 - t0) * 1000)
                else:
                    stats["failed_in_window"] += 1

    async def cpu_clock() -> None:
        await asyncio.sleep(window_start - loop.time())
        cpu["start"] = own_cpu_s()
        await asyncio.sleep(window_end - loop.time())
        cpu["end"] = own_cpu_s()

    try:
        await asyncio.gather(cpu_clock(), *(worker() for _ in range(concurrency)))
    finally:
        await close()
    ok_total = stats.pop("ok", 0)
    failed_in_window = stats.pop("failed_in_window", 0)
    cpu_s = cpu["end"] - cpu["start"]
    return {
        "target": target, "pushes_per_s": len(latencies_ms) / seconds,
        "p50_ms": nearest_rank(latencies_ms, 0.50), "p99_ms": nearest_rank(latencies_ms, 0.99),
        "cpu_util": cpu_s / seconds,
        "pushes_per_cpu_s": len(latencies_ms) / cpu_s if cpu_s > 0 else float("nan"),
        "ok_total": ok_total, "failed_in_window": failed_in_window, "errors": dict(stats),
    }


Push = Callable[[int, bytes], Awaitable[str | None]]


async def _pusher(target: str, url: str,
                  concurrency: int) -> tuple[Push, Callable[[], Awaitable[None]]]:
    """`push(n, body)` -> None on a 2xx, else an error text; and the closer of its client."""
    if target == BASELINE:
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                        timeout=aiohttp.ClientTimeout(total=5))
        headers = {"content-type": "application/json"}

        async def raw_push(n: int, body: bytes) -> str | None:
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    return None if 200 <= response.status < 300 else f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                return type(exc).__name__

        return raw_push, session.close

    from msgbus.delivery.senders import make_sender
    from msgbus.models import Envelope, Subscription
    from msgbus.settings import PushSettings

    sender = make_sender(target, instance=f"bench-{target}", push=PushSettings())
    await sender.start()
    subscription = Subscription(destination="bench", name="senders", url=url,  # type: ignore[arg-type]
                                max_concurrency=min(concurrency, 1024))

    async def sender_push(n: int, body: bytes) -> str | None:
        envelope = Envelope(message_id=f"bench-{n}", destination="bench", body=body)
        result = await sender.push(envelope, subscription, attempt=1)
        return None if result.ok else result.error or "failed"

    return sender_push, sender.close


# ---- the parent: subscriber, phases, figures -----------------------------------------------------


def _delivered(sub_url: str, label: str, hi: int) -> int:
    with urllib.request.urlopen(f"{sub_url}/_count/{label}?lo=0&hi={hi}", timeout=10) as answer:
        return int(orjson.loads(answer.read())["unique"])


def run_phase(ctx: Any, stack: contextlib.ExitStack, args: argparse.Namespace, sub_url: str,
              target: str, run: int) -> dict[str, Any]:
    label = f"{target}-r{run}"
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    process = ctx.Process(target=phase_worker, name=f"bench-{label}", daemon=True,
                          args=(child_conn, target, f"{sub_url}/hook/{label}", args.concurrency,
                                args.warmup_s, args.seconds, args.uvloop))
    stack.callback(stop_process, process, f"phase {label}")
    figures = figures_of(process, parent_conn, child_conn,
                         args.warmup_s + args.seconds + PHASE_GRACE_S, label)
    figures["run"] = run
    figures["lost"] = max(0, figures["ok_total"] - _delivered(sub_url, label,
                                                               10**12))
    say(f"run {run} {target:<8} {figures['pushes_per_s']:8.0f} pushes/s"
        f"  p50 {figures['p50_ms']:6.1f}  p99 {figures['p99_ms']:6.1f} ms"
        f"  cpu {figures['cpu_util']:4.0%}  {figures['pushes_per_cpu_s']:8.0f} pushes/cpu-s"
        + (f"  errors {figures['errors']}" if figures["errors"] else "")
        + (f"  LOST {figures['lost']}" if figures["lost"] else ""))
    return figures


def summarize(phases: list[dict[str, Any]]) -> dict[str, Any]:
    figures = ("pushes_per_s", "p50_ms", "p99_ms", "pushes_per_cpu_s", "cpu_util")
    summary: dict[str, Any] = {}
    raw = {p["run"]: p for p in phases if p["target"] == BASELINE}
    for target in dict.fromkeys(p["target"] for p in phases):
        rows = [p for p in phases if p["target"] == target]
        summary[target] = {f: spread([p[f] for p in rows]) for f in figures}
        summary[target]["failed"] = sum(p["failed_in_window"] for p in rows)
        summary[target]["lost"] = sum(p["lost"] for p in rows)
        if target != BASELINE:
            summary[target]["vs_raw"] = spread(
                [p["pushes_per_s"] / raw[p["run"]]["pushes_per_s"] for p in rows
                 if p["run"] in raw and raw[p["run"]]["pushes_per_s"] > 0])
    return summary


def table(summary: dict[str, Any]) -> list[str]:
    head = (f"{'target':<8} {'pushes/s':>22} {'p50 ms':>19} {'p99 ms':>19}"
            f" {'pushes per cpu-s':>22} {'÷ raw (same run)':>20} {'failed':>6} {'lost':>5}")
    lines = ["min / median / max over runs", head, "-" * len(head)]
    for target, s in summary.items():
        ratio = cell(s["vs_raw"], ".3f") if "vs_raw" in s else "1"
        lines.append(f"{target:<8} {cell(s['pushes_per_s'], '.0f'):>22}"
                     f" {cell(s['p50_ms'], '.1f'):>19} {cell(s['p99_ms'], '.1f'):>19}"
                     f" {cell(s['pushes_per_cpu_s'], '.0f'):>22} {ratio:>20}"
                     f" {s['failed']:>6} {s['lost']:>5}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("senders", __doc__, runs=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured, per phase")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="per phase, not counted")
    parser.add_argument("--concurrency", type=int, default=64, help="pushes in flight")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, from {','.join(TARGETS)}; raw is always run")
    parser.add_argument("--uvloop", action="store_true",
                        help="run the phases on uvloop (the dispatcher uses asyncio's own loop)")
    args = parser.parse_args(argv)
    args.targets = tuple(dict.fromkeys([BASELINE, *args.targets.split(",")]))
    if unknown := set(args.targets) - set(TARGETS):
        parser.error(f"unknown targets {sorted(unknown)}; choose from {', '.join(TARGETS)}")
    if args.runs < 1 or args.seconds <= 0 or args.warmup_s < 0 or args.concurrency < 1:
        parser.error("--runs and --concurrency must be >= 1, --seconds > 0, --warmup-s >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    targets = args.targets

    def work(exits: contextlib.ExitStack) -> list[dict[str, Any]]:
        ctx = multiprocessing.get_context("spawn")
        port = start_subscriber(ctx, exits)
        sub_url = f"http://{HOST}:{port}"
        phases = []
        for run in range(1, args.runs + 1):
            shift = (run - 1) % len(targets)
            for target in targets[shift:] + targets[:shift]:
                phases.append(run_phase(ctx, exits, args, sub_url, target, run))
        return phases

    def report(phases: list[dict[str, Any]], began: float) -> int:
        summary = summarize(phases)
        out_lines(table(summary))
        out(f"\nwall time {time.monotonic() - began:.0f} s")
        result = {
            "bench": "senders", "runs": args.runs, "seconds": args.seconds,
            "concurrency": args.concurrency, "loop": "uvloop" if args.uvloop else "asyncio",
            **{f"{t}_pushes_per_s": summary[t]["pushes_per_s"]["median"] for t in targets},
            **{f"{t}_vs_raw": summary[t]["vs_raw"]["median"] for t in targets if t != BASELINE},
            "p50_ms": {t: summary[t]["p50_ms"]["median"] for t in targets},
            "p99_ms": {t: summary[t]["p99_ms"]["median"] for t in targets},
            "pushes_per_cpu_s": {t: summary[t]["pushes_per_cpu_s"]["median"] for t in targets},
            "failed": {t: summary[t]["failed"] for t in targets},
            "lost": {t: summary[t]["lost"] for t in targets},
        }
        out_json(result)
        return 1 if any(result["lost"].values()) else 0

    return cli.run(f"sender benchmark: {args.runs} run(s) x {len(targets)} targets, "
                   f"{args.seconds:g} s measured after {args.warmup_s:g} s warm-up, "
                   f"{args.concurrency} pushes in flight, "
                   f"{'uvloop' if args.uvloop else 'asyncio'} loop, baseline {BASELINE}",
                   work, report)


if __name__ == "__main__":
    sys.exit(main())
