"""How tests, the test kit and the benchmarks wait for something: by polling a condition until it
holds (`eventually`), never by sleeping for as long as it usually takes.

One argument order for both forms: `condition, timeout_s, what`, then keywords.

- `eventually(...)` blocks: tests that drive a bus in other processes or a background loop,
  the test kit, scripts and benchmarks.
- `await eventually_async(...)` awaits: tests running on the event loop; it also awaits what
  `condition()` returns when that is awaitable (e.g. a MongoDB query).

Both poll `condition()` every `interval_s`, return its first truthy value, and after `timeout_s`
raise `NotInTime` (an `AssertionError`) saying what was awaited (`what`, or else the condition's
source) and, with `progress`, how far it got. `progress` (a callable returning a short text, e.g.
"40/100 delivered") is also printed to stderr every `PROGRESS_EVERY_S` while waiting. `Steady`
is a condition that holds once a value stopped changing.

A budget is room for a busy machine, never a promise of speed (benchmarks measure speed; a test
that promises a time measures it and asserts it). `MSGBUS_TEST_PATIENCE` multiplies every budget:
scripts/test.sh sets 2 for its parallel pass, where the MongoDB stand-in stalls for 10-25 s at
times (docs/decisions.md, "Patience in the parallel pass"). A wait that is bounded on purpose
(it gives up without failing) passes `patient=False`.

A sleep stays only where time passing is the scenario itself (a slow subscriber, paced load, a
window in which something must NOT happen); the client's own tests (client/tests) keep a copy of
this helper because they run with the client package alone."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_INTERVAL_S = 0.05
PROGRESS_EVERY_S = 5.0


class NotInTime(AssertionError):
    """The awaited condition did not hold within its time budget."""


def patience() -> float:
    """What every budget is multiplied by (`MSGBUS_TEST_PATIENCE`, default 1)."""
    return float(os.environ.get("MSGBUS_TEST_PATIENCE") or 1)


def eventually(condition: Callable[[], Any], timeout_s: float = DEFAULT_TIMEOUT_S,
               what: str | None = None, *, interval_s: float = DEFAULT_INTERVAL_S,
               progress: Callable[[], str] | None = None, patient: bool = True) -> Any:
    """Poll until `condition()` is truthy and return that value; `NotInTime` after
    `timeout_s` (times `patience()` unless not `patient`)."""
    waiting = _Waiting(condition, timeout_s, what, progress, patient)
    while not (value := condition()):
        waiting.check()
        time.sleep(interval_s)
    return value


async def eventually_async(condition: Callable[[], Any], timeout_s: float = DEFAULT_TIMEOUT_S,
                           what: str | None = None, *, interval_s: float = DEFAULT_INTERVAL_S,
                           progress: Callable[[], str] | None = None,
                           patient: bool = True) -> Any:
    """`eventually` for code on the event loop: sleeps with `asyncio.sleep`, and awaits what
    `condition()` returns when that is awaitable."""
    waiting = _Waiting(condition, timeout_s, what, progress, patient)
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        waiting.check()
        await asyncio.sleep(interval_s)


class Steady:
    """A condition for `eventually`: true once `value()` has not changed for `quiet_s` (to show
    that something stopped, watching it for a while is the only way). `last` is that value."""

    def __init__(self, value: Callable[[], Any], quiet_s: float) -> None:
        self._value = value
        self._quiet_s = quiet_s
        self._since: float | None = None
        self.last: Any = None

    def __call__(self) -> bool:
        now, at = self._value(), time.monotonic()
        if self._since is None or now != self.last:
            self.last, self._since = now, at
            return False
        return at - self._since >= self._quiet_s


class _Waiting:
    def __init__(self, condition: Callable[[], Any], timeout_s: float, what: str | None,
                 progress: Callable[[], str] | None, patient: bool) -> None:
        self._condition = condition
        self._timeout_s = timeout_s * (patience() if patient else 1.0)
        self._what = what
        self._progress = progress
        self._began = time.monotonic()
        self._next_note = self._began + PROGRESS_EVERY_S

    def check(self) -> None:
        """Raise `NotInTime` once the budget is spent; print the progress now and then."""
        waited = time.monotonic() - self._began
        if waited > self._timeout_s:
            got = f" (got {self._progress()})" if self._progress else ""
            raise NotInTime(f"timed out after {self._timeout_s:g} s waiting for {self.what}{got}")
        if self._progress is not None and waited >= self._next_note - self._began:
            print(f"  waiting for {self.what}: {self._progress()} ({waited:.0f} s)",
                  file=sys.stderr, flush=True)
            self._next_note += PROGRESS_EVERY_S

    @property
    def what(self) -> str:
        return self._what if self._what is not None else describe(self._condition)


def describe(condition: Callable[[], Any]) -> str:
    """A name for `condition` in a timeout error: a lambda's own source text, else its name."""
    name = getattr(condition, "__qualname__", None) or repr(condition)
    if getattr(condition, "__name__", "") != "<lambda>":
        return name
    try:
        source = textwrap.dedent(inspect.getsource(condition)).strip()
        tree = ast.parse(source if not source.endswith(",") else source[:-1])
    except (OSError, TypeError, SyntaxError):
        return name
    lambdas = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
    segment = ast.get_source_segment(source, lambdas[0]) if lambdas else None
    return " ".join(segment.split()) if segment else name
