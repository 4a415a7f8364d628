"""What the fault tests (tests/integration/test_resilience.py, test_broker_hangs.py) measure
around a fault held under a `SteadyLoad`: the window it lasted (`Outage`), what each destination
got pushed meanwhile, the receiver's answers and their latencies."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from msgbus.percentiles import nearest_rank
from msgbus_devtools.testkit.deployment import Deployment, wait_with_progress
from msgbus_devtools.testkit.load import Answer, SteadyLoad
from msgbus_devtools.testkit.procs import say
from msgbus_devtools.testkit.subscriber import RecordingSubscriber

CAUGHT_UP_TIMEOUT_S = 90


@dataclass
class Outage:
    """A time window in which something was down, and what had been pushed when it ended."""

    what: str
    began: float
    ended: float = 0.0
    pushed: dict[str, set[str]] = field(default_factory=dict)  # destination -> message ids

    def end(self, deployment: Deployment) -> None:
        self.ended = time.monotonic()
        self.pushed = {code: sub.message_ids() for code, sub in deployment.subscribers.items()}

    def answers(self, load: SteadyLoad) -> list[Answer]:
        return load.answered_within(self.began, self.ended)

    def held_back(self, load: SteadyLoad, destination: str) -> str | None:
        """None if most messages `destination` accepted in the first half of the outage were
        pushed before it ended (a free path takes well under a second; the other half of the
        outage is the margin); else what was held back."""
        half = (self.began + self.ended) / 2
        early = {a.message_id for a in load.answered_within(self.began, half)
                 if a.accepted and a.destination == destination}
        pushed = early & self.pushed.get(destination, set())
        if early and len(pushed) * 2 >= len(early):
            return None
        return (f"while {self.what} ({self.ended - self.began:.0f} s), {len(pushed)} of the "
                f"{len(early)} messages {destination} accepted in its first half were pushed "
                f"before it ended")


def hold(load: SteadyLoad, seconds: float, what: str) -> None:
    """Let the load run for `seconds` (scenario time, not an assertion), printing progress."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(5.0, left))
        say(f"  {what}: {load.summary()}")


def caught_up(deployment: Deployment, load: SteadyLoad,
              timeout_s: float = CAUGHT_UP_TIMEOUT_S) -> None:
    """Wait until each subscriber got every message accepted so far: the bus has recovered
    from one fault (e.g. a Kafka consumer group re-joining a restarted broker) before the next
    one, so that a slow recovery is not mistaken for one destination holding back another."""
    accepted: dict[str, set[str]] = {code: set() for code in deployment.destinations}
    for answer in load.answers():
        if answer.accepted:
            accepted[answer.destination].add(answer.message_id)

    def pushed() -> tuple[int, int]:
        got = sum(len(ids & deployment.subscribers[code].message_ids())
                  for code, ids in accepted.items())
        return got, sum(map(len, accepted.values()))

    wait_with_progress("every message accepted so far to be pushed", pushed, timeout_s)


def refusals(answers: list[Answer]) -> list[Answer]:
    return [a for a in answers if not a.accepted]


def examples(answers: list[Answer], limit: int = 3) -> str:
    return "; ".join(f"{a.status} {a.error}" for a in answers[:limit])


def spread(sorted_s: list[float]) -> str:
    """Median, p99 and max of sorted durations (seconds), in ms, for a report."""
    if not sorted_s:
        return "none"
    median, p99, most = (nearest_rank(sorted_s, q) * 1000 for q in (0.5, 0.99, 1.0))
    return f"median {median:.0f} ms, p99 {p99:.0f} ms, max {most:.0f} ms"


def latencies_s(answers: list[Answer]) -> list[float]:
    """Each answer's latency (sent to answered), sorted."""
    return sorted(a.answered_at - a.sent_at for a in answers)


def latency_quantile_s(answers: list[Answer], q: float) -> float:
    return nearest_rank(latencies_s(answers), q, empty=0.0)


def latency(answers: list[Answer]) -> str:
    """Median, p99 and max answer latency, for a report."""
    return spread(latencies_s(answers)) if answers else "no answers"


def push_delays_s(answers: list[Answer], subscriber: RecordingSubscriber, *,
                  unpushed_s: float | None = None) -> list[float]:
    """For each accepted answer, the seconds from the 202 to its message's first push at
    `subscriber` (sorted); a message not pushed yet is left out, or counts as `unpushed_s`
    (e.g. math.inf: never pushed is infinitely late)."""
    first: dict[str, float] = {}
    for push in list(subscriber.pushes):
        first.setdefault(push.message_id, push.at)
    if unpushed_s is None:
        return sorted(first[a.message_id] - a.answered_at for a in answers
                      if a.accepted and a.message_id in first)
    return sorted(first[a.message_id] - a.answered_at if a.message_id in first else unpushed_s
                  for a in answers if a.accepted)
