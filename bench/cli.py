"""What the benchmarks' `main()`s share: the argument parser of `python -m bench.<name>` and its
`--quick` smoke settings; running the benchmark with everything it starts registered on one
ExitStack, so that all of it is stopped at the end, on an error, on Ctrl-C and on SIGTERM (a
scratch directory too, removed with the rest); and its runs, each printed as it ends."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bench.report import out, say

INTERRUPTED = 130  # main()'s exit code after a Ctrl-C: the shell's for SIGINT
TERMINATED = 143  # after a SIGTERM

T = TypeVar("T")


class _Printed(Protocol):
    def lines(self) -> list[str]: ...


R = TypeVar("R", bound=_Printed)


def parser(name: str, doc: str | None, *, runs: int | None = None) -> argparse.ArgumentParser:
    """The parser of `python -m bench.<name>`: the module's doc as its description, kept as
    written; with `runs`, its first option `--runs` of that default."""
    made = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    if runs is not None:
        made.add_argument("--runs", type=int, default=runs)
    return made


def parse_quick(parser: argparse.ArgumentParser, argv: list[str] | None, help: str,
                **quick: Any) -> argparse.Namespace:
    """Add the last option, `--quick` (described by `help`), parse `argv`, and with --quick
    set the options named in `quick` to its values: the smoke check's settings."""
    parser.add_argument("--quick", action="store_true", help=help)
    args = parser.parse_args(argv)
    if args.quick:
        for option, value in quick.items():
            setattr(args, option, value)
    return args


def run(headline: str, work: Callable[[contextlib.ExitStack], T],
        report: Callable[[T, float], int]) -> int:
    """A benchmark's `main()` after its arguments: print `headline`, call `work(exits)`, which
    registers on `exits` whatever it starts (all of it is stopped when `work` returns or raises,
    on Ctrl-C and on SIGTERM, which exits with `TERMINATED`), then return `report(its result,
    the monotonic time the benchmark began)`: the exit code. `INTERRUPTED` after a Ctrl-C."""
    began = time.monotonic()
    out(headline)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(TERMINATED))  # runs the cleanup too
    try:
        with contextlib.ExitStack() as exits:
            result = work(exits)
            say("done; stopping what the benchmark started")
    except KeyboardInterrupt:
        say("interrupted; everything the benchmark started was stopped")
        return INTERRUPTED
    return report(result, began)


def scratch_dir(exits: contextlib.ExitStack, prefix: str) -> Path:
    """A new directory in the temp dir, removed with everything on `exits`."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    exits.callback(shutil.rmtree, workdir, ignore_errors=True)
    return workdir


def each_run(run_once: Callable[[int], R], runs: int) -> list[R]:
    """`run_once(1)` .. `run_once(runs)`, each run's `lines()` printed on stdout as it ends."""
    done: list[R] = []
    for run in range(1, runs + 1):
        done.append(run_once(run))
        for line in done[-1].lines():
            out(line)
    return done
