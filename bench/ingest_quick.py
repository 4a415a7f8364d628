"""A quick slice of `python -m bench.ingest`: single messages only, 1 worker, one broker,
alternating the bare endpoint and the receiver, then the receiver's req/s ÷ the bare
endpoint's req/s paired per run (min/median/max). With --half, each target is then also paced
at half of the rate it reached, and the receiver's p99 ÷ the bare endpoint's p99 is reported.

    python -m bench.ingest_quick [--runs 3] [--duration 5] [--broker kafka] [--half]

A few minutes instead of ~30: for before/after comparisons of the receiver's per-request cost,
not for the figures of record. Same stack (bench/ingest_stack.py) and wrk settings.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys

from bench.ingest import CONNECTIONS, WRK_THREADS, pick_workdir
from bench.ingest_stack import IngestStack
from bench.report import out, say
from bench.wrk_runner import WrkResult, run_wrk, wrk_binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_quick",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--broker", default="kafka", choices=["kafka", "rabbitmq", "direct"])
    parser.add_argument("--half", action="store_true",
                        help="also measure p99 at half load (the goal's p99 ratio)")
    args = parser.parse_args(argv)
    wrk_binary()
    rows: list[tuple[float, float]] = []
    p99_rows: list[tuple[float, float]] = []
    with contextlib.ExitStack() as exits:
        workdir = pick_workdir()
        exits.callback(shutil.rmtree, workdir, ignore_errors=True)
        stack = IngestStack(workdir, exits, [args.broker])
        stack.start()
        bare, receiver = stack.bare[1], stack.receivers[1]
        code = stack.destinations[(1, args.broker)]

        def wrk(url: str, destination: str, seconds: int, rate: float | None = None) -> WrkResult:
            result = run_wrk(url, "single", destination, stack.api_key, duration_s=seconds,
                             threads=WRK_THREADS,
                             connections=CONNECTIONS["half" if rate else "single"],
                             rate_per_s=rate)
            if result.failed:
                say(f"  {result.failed} requests failed {result.errors}")
            return result

        def measure(url: str, destination: str, seconds: int) -> float:
            result = wrk(url, destination, seconds)
            return result.ok_requests / result.duration_s if result.duration_s else 0.0

        say("warming up")
        measure(bare.url, "bare", args.warmup)
        measure(receiver.url, code, args.warmup)
        stack.wait_flushed(receiver, 120)
        for run in range(1, args.runs + 1):
            # alternate which goes first, so a drift hits both alike
            order = ("bare", "receiver") if run % 2 else ("receiver", "bare")
            got: dict[str, float] = {}
            for name in order:
                if name == "bare":
                    got[name] = measure(bare.url, "bare", args.duration)
                else:
                    got[name] = measure(receiver.url, code, args.duration)
                    stack.wait_flushed(receiver, 120)
            rows.append((got["bare"], got["receiver"]))
            say(f"run {run}: bare {got['bare']:.0f} req/s, receiver {got['receiver']:.0f} "
                f"req/s, ratio {got['receiver'] / got['bare']:.3f}")
            if args.half:
                bare_p99 = wrk(bare.url, "bare", args.duration, got["bare"] / 2).p99_ms
                receiver_p99 = wrk(receiver.url, code, args.duration, got["receiver"] / 2).p99_ms
                stack.wait_flushed(receiver, 120)
                p99_rows.append((bare_p99, receiver_p99))
                say(f"run {run} half load: bare p99 {bare_p99:.2f} ms, receiver p99 "
                    f"{receiver_p99:.2f} ms, ratio {receiver_p99 / bare_p99:.2f}")
    figures = [("bare req/s", [b for b, _ in rows]),
               ("receiver req/s", [r for _, r in rows]),
               ("ratio", [r / b for b, r in rows])]
    if p99_rows:
        figures += [("bare p99 ms", [b for b, _ in p99_rows]),
                    ("receiver p99 ms", [r for _, r in p99_rows]),
                    ("p99 ratio", [r / b for b, r in p99_rows])]
    for label, values in figures:
        out(f"{label:<15} min {min(values):9.3f}  median {statistics.median(values):9.3f}  "
            f"max {max(values):9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
