"""Batch pushes against single pushes (issue 29 part 3): messages/s the dispatcher's push path
delivers to one subscriber, one message per push against batches of `--batch` (100), in the
same run.

    python -m bench.batches [--runs 3] [--seconds 5] [--concurrency 16] [--batch 100]

- One recording subscriber (`bench/subscriber.py`, raw ASGI under uvicorn and uvloop) in a
  process of its own on 127.0.0.1 answers 200 to every push and counts each message once.
- Each phase runs in a fresh spawned process with the dispatcher's own pieces: a
  `SubscriptionLimiter` (circuit breaker, `--concurrency` slots) and `H1Sender`.
  `single`: `--concurrency` pushers, each `acquire` + `push_through` + `outcome_of` in a loop,
  as `Pushers._pusher` (dispatcher/pushers.py) does. `batch`: a `BatchCollector`
  (dispatcher/batching.py) fed as fast as it takes messages, pushing batches of `--batch` in
  the same slots.
  Outcomes are computed for every message and then dropped: the broker's consume and the trace
  writes are left out (they are the same per message for both), so the figure is the push
  path's, not the whole dispatcher's.
- messages/s: messages whose push was answered 2xx within the measured window (after
  `--warmup-s`) ÷ its length. ratio = batch ÷ single of the same run. Runs alternate the order
  of the two phases. Bodies are ~200 bytes, as bench.senders.

Progress to stderr; the min/median/max table to stdout, the last line one JSON object. It stops
every process it started by its PID.
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
from multiprocessing.connection import Connection
from typing import Any

import orjson

from bench import cli
from bench.pipeline import figures_of, start_subscriber
from bench.report import out, out_json, out_lines, say, spread

HOST = "127.0.0.1"
PHASES = ("single", "batch")
PAD = "a benchmark message of typical size " * 4
PHASE_GRACE_S = 30.0


def phase_worker(conn: Connection, phase: str, url: str, args: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us by pid
    conn.send(asyncio.run(_phase(phase, url, **args)))
    conn.close()


async def _phase(phase: str, url: str, *, concurrency: int, batch: int, warmup_s: float,
                 seconds: float) -> dict[str, Any]:
    from msgbus.delivery.breaker import CircuitBreaker
    from msgbus.delivery.limiter import SubscriptionLimiter
    from msgbus.delivery.senders import make_sender
    from msgbus.delivery.slots import AdjustableSlots
    from msgbus.models import DeliveryOutcome, Envelope, Subscription
    from msgbus.settings import PushSettings

    sub = Subscription(destination="bench", name=phase, url=url,  # type: ignore[arg-type]
                       max_concurrency=concurrency,
                       batch_max_messages=batch if phase == "batch" else None,
                       batch_max_wait_ms=20)
    limiter = SubscriptionLimiter(sub.id, AdjustableSlots(concurrency), CircuitBreaker(sub.id))
    sender = make_sender("h1", instance=f"bench-{phase}", push=PushSettings())
    await sender.start()
    loop = asyncio.get_running_loop()
    window_start = loop.time() + warmup_s
    window_end = window_start + seconds
    counted = {"in_window": 0, "failed": 0}
    numbers = itertools.count()
    closing = asyncio.Event()

    def envelope() -> Envelope:
        n = next(numbers)
        return Envelope(message_id=f"bench-{phase}-{n}", destination="bench",
                        body=orjson.dumps({"sent_at": time.time(), "n": n, "pad": PAD}))

    async def record(outcomes: list[DeliveryOutcome]) -> None:
        now = loop.time()
        for outcome in outcomes:
            if not outcome.result.ok:
                counted["failed"] += 1
            elif window_start <= now < window_end:
                counted["in_window"] += 1

    try:
        if phase == "batch":
            await _run_batches(sub, limiter, sender, envelope, record, closing, window_end)
        else:
            await _run_singles(sub, limiter, sender, envelope, record, closing, window_end)
    finally:
        closing.set()
        await sender.close()
    return {"phase": phase, "messages_per_s": counted["in_window"] / seconds,
            "failed": counted["failed"]}


async def _run_singles(sub: Any, limiter: Any, sender: Any, envelope: Any, record: Any,
                       closing: asyncio.Event, window_end: float) -> None:
    from msgbus.delivery.attempt import outcome_of, push_through

    loop = asyncio.get_running_loop()

    async def pusher() -> None:
        while loop.time() < window_end:
            env = envelope()
            await limiter.acquire(closing)
            result = await push_through(limiter, sender, env, sub, 1)
            await record([outcome_of(result, env, sub, attempts_so_far=1)])

    await asyncio.gather(*(pusher() for _ in range(sub.max_concurrency)))


async def _run_batches(sub: Any, limiter: Any, sender: Any, envelope: Any, record: Any,
                       closing: asyncio.Event, window_end: float) -> None:
    from dispatcher.batching import BatchCollector
    from dispatcher.context import PushContext

    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    def track(coro: Any) -> None:
        task = asyncio.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    context = PushContext(sub, limiter, sender, track, closing)
    collector = BatchCollector(context, record)
    running = asyncio.create_task(collector.run())
    while loop.time() < window_end:
        await collector.add(envelope(), None)
    closing.set()
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    if tasks:
        await asyncio.wait(tasks, timeout=10)


def run_phase(ctx: Any, args: argparse.Namespace, sub_url: str, phase: str,
              run: int) -> dict[str, Any]:
    label = f"{phase}-r{run}"
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    process = ctx.Process(target=phase_worker, name=f"bench-{label}", daemon=True, args=(
        child_conn, phase, f"{sub_url}/hook/{label}",
        {"concurrency": args.concurrency, "batch": args.batch, "warmup_s": args.warmup_s,
         "seconds": args.seconds}))
    figures = figures_of(process, parent_conn, child_conn,
                         args.warmup_s + args.seconds + PHASE_GRACE_S, label)
    figures["run"] = run
    say(f"run {run} {phase:<6} {figures['messages_per_s']:9.0f} messages/s"
        + (f"  failed {figures['failed']}" if figures["failed"] else ""))
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.batches")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch", type=int, default=100)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work(exits: contextlib.ExitStack) -> list[dict[str, Any]]:
        ctx = multiprocessing.get_context("spawn")
        port = start_subscriber(ctx, exits)
        phases = []
        for run in range(1, args.runs + 1):
            order = PHASES if run % 2 else PHASES[::-1]
            phases += [run_phase(ctx, args, f"http://{HOST}:{port}", p, run) for p in order]
        return phases

    def report(phases: list[dict[str, Any]], began: float) -> int:
        by_run = {(p["phase"], p["run"]): p for p in phases}
        single = [p["messages_per_s"] for p in phases if p["phase"] == "single"]
        batched = [p["messages_per_s"] for p in phases if p["phase"] == "batch"]
        ratios = [by_run[("batch", r)]["messages_per_s"] / by_run[("single", r)]["messages_per_s"]
                  for r in range(1, args.runs + 1)]
        rows = {"single pushes, messages/s": spread(single),
                f"batches of {args.batch}, messages/s": spread(batched),
                "ratio batch / single": spread(ratios)}
        out_lines([f"{name:<32} min {s['min']:9.1f}  median {s['median']:9.1f}  "
                   f"max {s['max']:9.1f}" for name, s in rows.items()])
        out(f"\nwall time {time.monotonic() - began:.0f} s")
        failed = sum(p["failed"] for p in phases)
        out_json({"bench": "batches", "runs": args.runs, "batch": args.batch,
                  "concurrency": args.concurrency, "seconds": args.seconds,
                  "single_messages_per_s": rows["single pushes, messages/s"],
                  "batch_messages_per_s": rows[f"batches of {args.batch}, messages/s"],
                  "ratio": rows["ratio batch / single"], "goal_ratio": 5.0, "failed": failed})
        return 1 if failed else 0

    return cli.run(f"batch benchmark: {args.runs} run(s), single pushes vs batches of "
                   f"{args.batch}, {args.concurrency} in flight, {args.seconds:g} s measured",
                   work, report)


if __name__ == "__main__":
    sys.exit(main())
