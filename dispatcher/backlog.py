"""`BacklogMonitor`: per subscription this dispatcher serves, the backlog and the age of the oldest
undelivered message from the bus's own records (one measure for Kafka, RabbitMQ and the direct
path; the broker's own lag is `dispatcher/brokerhealth.py`'s), and the partitions its consumers
paused, as gauges; an age past the subscription's delivery objective is told to its team
(`on_late`); the backlog and age also as samples over time for the admin's subscription
page (`msgbus/store/pushstats.py`). See docs/decisions.md, "Backlog from the bus's own records,
not broker watermarks"."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from msgbus.metrics import BACKLOG, OLDEST_UNDELIVERED_AGE, PAUSED_PARTITIONS
from msgbus.models import utcnow
from msgbus.store import MongoStore
from msgbus.tasks import GAUGE_MAX_BUSY, PeriodicWork

# A count reads every entry it counts, from the MongoDB server the bus's records need: beyond
# this, the exact size tells an operator nothing the oldest undelivered age does not (see
# docs/decisions.md, "Gauges that count little and back off").
BACKLOG_CAP = 10_000


class BacklogMonitor(PeriodicWork):
    def __init__(self, store: MongoStore, paused_partitions: Callable[[], dict[str, int]], *,
                 interval_s: float, late_after_s: Callable[[str], float | None] = lambda _: None,
                 on_late: Callable[[str, float, float], None] = lambda *_: None) -> None:
        super().__init__()
        self._store = store
        self._paused_partitions = paused_partitions  # subscription id -> paused partitions
        self._late_after_s = late_after_s  # subscription id -> its delivery objective
        self._on_late = on_late  # (subscription id, oldest age, objective)
        self._shown: set[str] = set()
        self._sampled_some: set[str] = set()  # whose last sample written held a backlog
        self.every(interval_s, self.update, what="backlog metrics", max_busy=GAUGE_MAX_BUSY,
                   ready=store.gate.wait_available)

    async def update(self) -> None:
        paused = self._paused_partitions()
        for sub_id in self._shown - set(paused):  # no longer served here
            for gauge in (BACKLOG, OLDEST_UNDELIVERED_AGE, PAUSED_PARTITIONS):
                with contextlib.suppress(KeyError):
                    gauge.remove(sub_id)
            self._sampled_some.discard(sub_id)
        self._shown = set(paused)
        now = utcnow()
        # one scan across subscriptions; only those it names are counted (the others' backlog
        # is empty): idle subscriptions cost no MongoDB operation
        with_backlog = await self._store.progress.subscriptions_with_backlog(list(paused))
        samples = []
        for sub_id, partitions in paused.items():
            PAUSED_PARTITIONS.labels(sub_id).set(partitions)
            count, oldest = (await self._store.progress.backlog(sub_id, BACKLOG_CAP)
                             if sub_id in with_backlog else (0, None))
            BACKLOG.labels(sub_id).set(count)
            age = 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
            OLDEST_UNDELIVERED_AGE.labels(sub_id).set(age)
            objective = self._late_after_s(sub_id)
            if objective is not None and age > objective:
                self._on_late(sub_id, age, objective)
            if self._worth_a_sample(sub_id, count, age):
                samples.append((sub_id, count, age))
        # and over time, for the admin's subscription page
        await self._store.figures.record_backlog_samples(samples)

    def _worth_a_sample(self, sub_id: str, count: int, age: float) -> bool:
        """A sample of an empty backlog is written once after a non-empty one (a minute keeps
        its latest sample), not on every pass: the charts draw nothing for an empty backlog
        and for no sample alike."""
        some = bool(count or age)
        was = sub_id in self._sampled_some
        if some:
            self._sampled_some.add(sub_id)
        else:
            self._sampled_some.discard(sub_id)
        return some or was
