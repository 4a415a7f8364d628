"""Faults at random moments: a seeded plan, and a runner that injects and recovers them.

A `FaultPlan` gives each kind of fault a start time and a down time drawn from a seeded RNG
(the same seed, window and kinds give the same plan). Faults may overlap, as real incidents
sometimes do. `FaultRunner` runs each fault on a thread of its own: at its start time it calls
the fault's `inject`, waits its down time, calls `recover`, and records when each step happened
(seconds after the runner's epoch) and how long it took.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    what: str  # for the printed schedule
    down_s: tuple[float, float]  # down time drawn from this range
    recovery_s: float  # about how long recovering takes (a restart): planned for, not timed


@dataclass(frozen=True, slots=True)
class PlannedFault:
    kind: FaultKind
    start_s: float  # after the epoch
    down_s: float
    target: str = ""  # which one, when there are several (e.g. a subscription)


@dataclass
class FaultPlan:
    seed: int
    window_s: float
    faults: list[PlannedFault]

    @classmethod
    def draw(cls, seed: int, window_s: float, kinds: list[FaultKind],
             targets: dict[str, list[str]] | None = None) -> FaultPlan:
        """One fault of each kind, each ending (recovered) within `window_s`; `targets`
        names the candidates of a kind that has several (one is drawn)."""
        rng = random.Random(seed)
        faults = []
        for kind in kinds:
            down = rng.uniform(*kind.down_s)
            latest = window_s - down - kind.recovery_s
            if latest < 0:
                raise ValueError(f"a window of {window_s:.0f} s is too short for {kind.name}")
            start = rng.uniform(0, latest)
            target = rng.choice(targets[kind.name]) if targets and kind.name in targets else ""
            faults.append(PlannedFault(kind, round(start, 1), round(down, 1), target))
        return cls(seed, window_s, sorted(faults, key=lambda f: f.start_s))

    def describe(self) -> str:
        rows = [f"  at {f.start_s:5.1f} s  {f.kind.what}{f' ({f.target})' if f.target else ''}"
                f", {f.down_s:.1f} s down, then recovered" for f in self.faults]
        return (f"fault schedule (seed {self.seed}, within {self.window_s:.0f} s):\n"
                + "\n".join(rows))


@dataclass
class FaultRun:
    """What happened to one planned fault (seconds after the runner's epoch)."""

    planned: PlannedFault
    injected_at_s: float | None = None
    inject_took_s: float | None = None
    recovery_at_s: float | None = None
    recovered_at_s: float | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.recovered_at_s is not None or self.error is not None

    def as_json(self) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 2)

        return {
            "fault": self.planned.kind.name,
            "target": self.planned.target or None,
            "planned_at_s": self.planned.start_s,
            "planned_down_s": self.planned.down_s,
            "injected_at_s": rounded(self.injected_at_s),
            "inject_took_s": rounded(self.inject_took_s),
            "recovery_at_s": rounded(self.recovery_at_s),
            "recovered_at_s": rounded(self.recovered_at_s),
            "error": self.error,
        }


Action = Callable[[PlannedFault], object]


@dataclass
class FaultRunner:
    plan: FaultPlan
    # per kind name: inject(fault), recover(fault)
    actions: dict[str, tuple[Action, Action]]
    say: Callable[[str], None] = print
    epoch: float = 0.0
    runs: list[FaultRun] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _cancel: threading.Event = field(default_factory=threading.Event)

    def start(self) -> FaultRunner:
        missing = {f.kind.name for f in self.plan.faults} - set(self.actions)
        if missing:
            raise ValueError(f"no actions for {sorted(missing)}")
        self.epoch = time.monotonic()
        for planned in self.plan.faults:
            run = FaultRun(planned)
            self.runs.append(run)
            thread = threading.Thread(target=self._run, args=(run,), daemon=True,
                                      name=f"fault-{planned.kind.name}")
            self._threads.append(thread)
            thread.start()
        return self

    def now_s(self) -> float:
        return time.monotonic() - self.epoch

    def done(self) -> bool:
        return all(run.done for run in self.runs)

    def active(self) -> list[str]:
        """The faults injected and not yet recovered."""
        return [run.planned.kind.name for run in self.runs
                if run.injected_at_s is not None and not run.done]

    def cancel(self) -> None:
        """Inject nothing more (faults already injected are still recovered)."""
        self._cancel.set()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not self.done():
            raise AssertionError(f"faults not over after {timeout_s:.0f} s: {self.active()}")

    def _run(self, run: FaultRun) -> None:
        planned = run.planned
        inject, recover = self.actions[planned.kind.name]
        if self._cancel.wait(max(0.0, planned.start_s - self.now_s())):
            run.error = "cancelled before it began"
            return
        label = planned.kind.what + (f" ({planned.target})" if planned.target else "")
        try:
            run.injected_at_s = self.now_s()
            self.say(f"chaos t={run.injected_at_s:.1f} s: {label}")
            inject(planned)
            run.inject_took_s = self.now_s() - run.injected_at_s
            time.sleep(planned.down_s)
        except Exception:
            run.error = f"inject: {traceback.format_exc(limit=3)}"
        try:
            run.recovery_at_s = self.now_s()
            recover(planned)
            run.recovered_at_s = self.now_s()
            self.say(f"chaos t={run.recovered_at_s:.1f} s: recovered from {label} (recovery "
                     f"took {run.recovered_at_s - run.recovery_at_s:.1f} s)")
        except Exception:
            run.error = (run.error or "") + f"recover: {traceback.format_exc(limit=3)}"
            self.say(f"chaos: recovering from {label} failed: {run.error}")
