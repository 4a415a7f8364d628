"""What a chaos run (devtools/msgbus_devtools/testkit/chaos.py) is given and what it reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from msgbus_devtools.testkit import accounting
from msgbus_devtools.testkit.deployment import Phases
from msgbus_devtools.testkit.faults import FaultPlan, FaultRunner

TIMELINE_S = 5
RECENT_S = 15.0  # a fault's duplicates arrive within this long after it is over
ROUND_S = 45.0  # a fault window of at least this long per round of faults


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    duration_s: float = 75.0  # of the load, at least (it runs on until every fault is over)
    rate_per_s: float = 150.0  # send()s per second, over both destinations
    lead_s: float = 10.0  # load before the fault window (the warm-up is in it)
    tail_s: float = 8.0  # load after the last fault is over
    quiet_timeout_s: float = 150.0  # for every message to reach every subscriber
    record_timeout_s: float = 60.0  # then for MongoDB to mark them delivered (reported only)
    # Compensator: quick retries and sweeps, so that messages left pending by a fault (a
    # dispatcher killed with direct-path messages in hand) are delivered within the run
    retry_delays_s: tuple[float, ...] = (1.0, 2.0, 4.0)
    sweep_after_s: float = 60.0
    lease_s: float = 5.0
    # of every subscription; 0: the product's default. Not lower: at 16 the subscriptions
    # caught up so slowly after the outages that their backlogs outlived sweep_after_s
    max_in_flight: int = 0

    @property
    def window_s(self) -> float:
        return self.duration_s - self.lead_s - self.tail_s

    @property
    def rounds(self) -> int:
        return max(1, int(self.window_s // ROUND_S))


@dataclass
class ChaosResult:
    config: ChaosConfig
    plan: FaultPlan
    accounts: list[accounting.SubscriptionAccount]
    totals: accounting.Totals
    faults: list[dict[str, Any]]
    load_s: float
    quiet_after_s: float  # from the end of the load until every message was delivered
    send_errors: dict[str, int]
    spooled_at_end: int
    brokers: dict[str, str]
    phases: Phases
    lost_examples: str = ""
    problems: list[str] = field(default_factory=list)
    # duplicates by the faults under way or recently over when they arrived
    duplicates_after: dict[str, int] = field(default_factory=dict)
    duplicate_timeline: dict[int, int] = field(default_factory=dict)  # 5 s bucket -> count

    def table(self) -> str:
        return accounting.table(self.accounts, self.totals, self.brokers)

    def fault_table(self) -> str:
        """When each fault began and ended, in seconds after the fault window began."""
        lines = ["faults (s after the window began): injected, down until, recovered"]
        for f in self.faults:
            def at(key: str, fault: dict[str, Any] = f) -> str:
                return "-" if fault[key] is None else f"{fault[key]:6.1f}"

            target = f" ({f['target']})" if f["target"] else ""
            lines.append(f"  {f['fault'] + target:32} {at('injected_at_s')} "
                         f"{at('recovery_at_s')} {at('recovered_at_s')}"
                         + (f"  ERROR {f['error']}" if f["error"] else ""))
        timeline = ", ".join(f"{start}-{start + TIMELINE_S}: {n}"
                             for start, n in sorted(self.duplicate_timeline.items()))
        after = ", ".join(f"{k}: {n}" for k, n in sorted(self.duplicates_after.items(),
                                                      key=lambda kv: -kv[1]))
        lines.append(f"duplicates by time (s): {timeline or 'none'}")
        lines.append(f"duplicates by the faults under way or over less than {RECENT_S:.0f} s "
                     f"before they arrived: {after or 'none'}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        c = self.config
        unrecorded = sum(a.expected - (a.recorded_delivered or 0) for a in self.accounts)
        return {
            **self.totals.as_json(),
            "seed": c.seed,
            "rate_per_s": c.rate_per_s,
            "max_in_flight": c.max_in_flight or None,
            "sweep_after_s": c.sweep_after_s,
            "load_s": round(self.load_s, 1),
            "quiet_after_s": round(self.quiet_after_s, 1),
            "subscriptions": len(self.accounts),
            "unrecorded_in_mongodb": unrecorded,
            "send_errors": self.send_errors,
            "spooled_at_end": self.spooled_at_end,
            "duplicates_after": self.duplicates_after,
            "faults": self.faults,
            "problems": self.problems,
        }


def attribute_duplicates(runner: FaultRunner, accounts: list[accounting.SubscriptionAccount],
                          ) -> tuple[dict[str, int], dict[int, int]]:
    """Duplicates counted by the faults under way or over less than RECENT_S before each
    arrived ("+" joins overlapping ones), and per TIMELINE_S bucket (seconds after the fault
    window began)."""
    windows = [(run.injected_at_s, (run.recovered_at_s or run.recovery_at_s or 1e9) + RECENT_S,
                run.planned.kind.name) for run in runner.runs if run.injected_at_s is not None]
    after: dict[str, int] = {}
    timeline: dict[int, int] = {}
    for acc in accounts:
        for at in acc.duplicate_times:
            t = at - runner.epoch
            cause = "+".join(name for began, until, name in windows if began <= t <= until)
            after[cause or "none"] = after.get(cause or "none", 0) + 1
            bucket = int(t // TIMELINE_S) * TIMELINE_S
            timeline[bucket] = timeline.get(bucket, 0) + 1
    return after, timeline
