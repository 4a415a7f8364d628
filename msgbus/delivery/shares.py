"""`CapShares`: one concurrency cap per subscription, whatever the number of processes that
push to it (dispatchers, compensators with their retries and replays), and one rate limit
(`max_rate_per_s`) the same way: each is a limit split into shares (`RateSlots` count the pushes
begun within the last second where `AdjustableSlots` count those in flight).

Each process holds a share of each subscription's `max_concurrency` and never has more pushes
in flight than its share (`AdjustableSlots`): no MongoDB round trip per push. The shares live
in MongoDB (`msgbus.store.shares`); every `heartbeat_s` a process
1. renews its lease (`instances`: alive until `lease_s` from now; also in between while a beat
   takes longer than `heartbeat_s`),
2. reads the subscriptions' share documents, drops the entries of dead instances,
3. works out its fair share from everyone's demand (`fair_shares`: nobody gets more than it
   asks for, what one does not need goes to the others), and
4. takes it (`decide`): a smaller share at once; a larger one only out of the room the others'
   recorded shares leave, so the recorded shares never add up to more than the cap, and a
   process's pushes in flight never exceed what it recorded.
A process that waits for a slot asks at once instead of at the next heartbeat. A dead process's
share comes free when its lease ends. Hermes negotiates a subscription's rate the same way
(consumers' shares by recent use, through ZooKeeper); this does it for concurrency, through
MongoDB, with compare-and-swap writes instead of a leader.

The same heartbeat carries each process's evidence of every subscriber's health to the others
(`msgbus.delivery.breaker`): one circuit per subscription, whoever pushes.

Beats go through the store's gate (`msgbus.store.gate`): while it is closed no beat waits on
MongoDB. When MongoDB cannot be reached, a process keeps its shares until its own lease would have
ended, then falls back to the cap divided by the number of processes it last saw pushing to
the subscription (each of them does the same), at least one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pymongo.errors import PyMongoError

from msgbus.delivery.breaker import CircuitBreaker, Evidence
from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.slots import AdjustableSlots, RateSlots, Share
from msgbus.errors import MongoUnavailable
from msgbus.metrics import CAP_SHARE, CIRCUIT_OPEN, RATE_SHARE
from msgbus.models import Subscription
from msgbus.store.shares import ShareStore
from msgbus.tasks import PeriodicWork

log = logging.getLogger(__name__)

RATE_SUFFIX = "#rate"  # the share document of a subscription's rate: "<subscription id>#rate"
ROTATE_S = 10.0  # when the cap is smaller than the processes wanting it, who gets one moves on
SWAP_TRIES = 3
MIN_BEAT_GAP_SHARE = 0.2  # of heartbeat_s: asks for slots wake the loop at most this often
UNSETTLED_BEAT_SHARE = 0.25  # of heartbeat_s: how often while pushes wait for a larger share
# max_rate_per_s is kept over windows a little longer than a second: pushes reach the subscriber
# after delays that vary (a loaded event loop, the network), so begins spread over 1.1 s can
# arrive within one second; this way a subscriber sees at most the rate in any second as long
# as the delays vary by less than 0.1 s (the rate used is ~91% of the limit)
RATE_WINDOW_S = 1.1


def fair_shares(cap: int, demands: dict[str, int], order: list[str]) -> dict[str, int]:
    """The cap split by demand (max-min fair, whole slots): first nobody gets more than it asks
    for, and the slots that do not divide evenly go in `order`; then what nobody asks for is
    dealt round in `order`, so that a process that is idle now can push its next message at
    once instead of asking first."""
    shares = dict.fromkeys(demands, 0)
    wanting = [name for name in order if demands.get(name, 0) > 0]
    room = cap
    while room > 0 and wanting:
        each = max(1, room // len(wanting))
        for name in list(wanting):
            given = min(each, demands[name] - shares[name], room)
            shares[name] += given
            room -= given
            if shares[name] >= demands[name]:
                wanting.remove(name)
            if room == 0:
                break
    for turn in range(room if order else 0):
        shares[order[turn % len(order)]] += 1
    return shares


def rotation(names: Iterable[str], now_s: float) -> list[str]:
    """`names` in an order every process works out alike, shifted every ROTATE_S."""
    ordered = sorted(names)
    if not ordered:
        return ordered
    shift = int(now_s // ROTATE_S) % len(ordered)
    return ordered[shift:] + ordered[:shift]


@dataclass(frozen=True, slots=True)
class Decision:
    held: int  # what this process records: at least what it has in use
    limit: int  # how many pushes it may start having in flight


def decide(cap: int, fair: int, others_held: int, in_use: int) -> Decision:
    """This process's share, given its fair share and what the others hold now."""
    limit = max(0, min(fair, cap - others_held))
    return Decision(held=max(limit, in_use), limit=limit)


def demand_changed(recorded: int, now: int) -> bool:
    """Worth a write: from or to zero, or by a quarter (the others' fair shares depend on it;
    every small change is not worth a MongoDB write)."""
    if (recorded == 0) != (now == 0):
        return True
    return abs(now - recorded) >= max(1, recorded // 4)


class CapShares(PeriodicWork):
    def __init__(self, store: ShareStore, *, instance: str, component: str,
                 heartbeat_s: float, lease_s: float, health_url: str | None = None) -> None:
        super().__init__()
        self._store = store
        self.instance = f"{component}:{instance}"
        # advertised with every beat: where the admin's Services panel reads this process's
        # /health (msgbus/settings.py `health_url`)
        self.health_url = health_url
        self._component = component
        self._heartbeat_s = heartbeat_s
        self._lease_s = lease_s
        # by limit: a subscription's id (its concurrency) or id + RATE_SUFFIX (its rate)
        self._slots: dict[str, Share] = {}
        self._caps: dict[str, int] = {}
        self._leaving: set[str] = set()  # limits whose entry is to be removed
        # whether the entries a former run of this instance (killed, then restarted under the
        # same name) left behind are known: those of limits it no longer serves must go, or
        # they would hold room of caps that moved to other instances meanwhile
        self._inherited = False
        self._pushers_seen: dict[str, int] = {}  # processes sharing each limit, last seen
        self._breakers: dict[str, CircuitBreaker] = {}  # by subscription id
        # told of every circuit's transition (subscription id, open), e.g. msgbus/notify.py's
        self.on_circuit: Callable[[str, bool], None] | None = None
        self._wake = asyncio.Event()  # a push waits with no slot at all: beat now
        self._lease_until = 0.0  # monotonic: when this process's lease ends unless renewed
        self._renewed_at = 0.0  # monotonic: the last renewal's start
        self._outage: str | None = None
        # the live instances of this process's component, as of the last beat (this one too)
        self.peers: frozenset[str] = frozenset()
        # by other live instance: the subscriptions it holds shares of (it serves them)
        self.hosted: dict[str, frozenset[str]] = {}
        # set at the second view: instances that start together have each written a lease by then
        self.peers_known = asyncio.Event()
        self._views = 0
        self.on_peers: Callable[[], None] | None = None  # told when either of them changes
        self.every(self._next_beat_in_s, self._heartbeat, what=f"cap shares {component}",
                   wake=self._wake, first_pause=True)
        self.every(heartbeat_s, self._keep_lease, what=f"lease {component}", first_pause=True)

    def slots(self, sub_id: str, cap: int) -> AdjustableSlots:
        """This process's slots of the subscription's concurrency (one object, whichever part
        asks)."""
        found = self._share(sub_id, cap, lambda on_wait: AdjustableSlots(0, on_wait=on_wait))
        assert isinstance(found, AdjustableSlots)
        return found

    def rate(self, sub_id: str, max_rate_per_s: int) -> RateSlots:
        """This process's share of the subscription's rate."""
        found = self._share(sub_id + RATE_SUFFIX, max_rate_per_s,
                            lambda on_wait: RateSlots(0, window_s=RATE_WINDOW_S,
                                                      on_wait=on_wait))
        assert isinstance(found, RateSlots)
        return found

    def breaker(self, sub: Subscription) -> CircuitBreaker:
        """The subscription's circuit in this process, under its current policy."""
        found = self._breakers.get(sub.id)
        if found is None:
            gauge = CIRCUIT_OPEN.labels(sub.id, self._component)

            def changed(is_open: bool, sub_id: str = sub.id) -> None:
                gauge.set(is_open)
                if self.on_circuit is not None:
                    self.on_circuit(sub_id, is_open)

            found = self._breakers[sub.id] = CircuitBreaker(sub.id, sub.circuit,
                                                            on_change=changed)
        found.policy = sub.circuit
        return found

    def limiter(self, sub: Subscription) -> SubscriptionLimiter:
        """A limiter of pushes to `sub` within this process's shares of its limits."""
        rate = None
        if sub.max_rate_per_s is None:
            self.forget(sub.id, rate_only=True)
        else:
            rate = self.rate(sub.id, sub.max_rate_per_s)
        return SubscriptionLimiter(sub.id, self.slots(sub.id, sub.max_concurrency),
                                   self.breaker(sub), rate=rate)

    def _share(self, key: str, cap: int, make: Callable[[Callable[[], None]], Share]) -> Share:
        self._caps[key] = cap
        self._leaving.discard(key)
        found = self._slots.get(key)
        if found is None:
            found = self._slots[key] = make(functools.partial(self._asked, key))
        return found

    def _asked(self, key: str) -> None:
        """A push waits for a slot: with none at all, ask now rather than at the next beat."""
        share = self._slots.get(key)
        if share is not None and share.limit == 0:
            self._wake.set()

    def subscription_ids(self) -> set[str]:
        return {key.removesuffix(RATE_SUFFIX) for key in self._slots}

    def forget(self, sub_id: str, *, rate_only: bool = False) -> None:
        """Nothing here pushes to the subscription (or limits its rate) any more: its shares
        go back."""
        if not rate_only:
            self._breakers.pop(sub_id, None)
        for key in ([] if rate_only else [sub_id]) + [sub_id + RATE_SUFFIX]:
            if self._slots.pop(key, None) is not None:
                self._caps.pop(key, None)
                self._leaving.add(key)
                self._wake.set()

    async def close(self) -> None:
        await super().close()
        with contextlib.suppress(PyMongoError, TimeoutError):
            await asyncio.wait_for(self._store.leave(self.instance), self._heartbeat_s)

    async def _heartbeat(self) -> None:
        try:
            # a beat still running when the lease ends would leave this process pushing
            # with a share the others may have taken back: it ends there
            async with self._store.gate.guard("cap shares", self._lease_left_s()):
                await self.beat()
            self._mongo_back()
        except (PyMongoError, MongoUnavailable) as exc:
            self._mongo_lost(exc)
        except Exception:  # a bug must not end the shares: the cap would freeze
            log.exception("cap shares: a heartbeat failed")
        # before the next pause: `_wake` starts a beat at most this often
        await asyncio.sleep(self._heartbeat_s * MIN_BEAT_GAP_SHARE)

    async def _keep_lease(self) -> None:
        """Renews the lease between beats while a beat takes long (one that settles hundreds
        of subscriptions after a move, on a busy MongoDB): a slow beat must not look like a
        dead process to the others, who would then take its shares and its subscriptions, and
        rewrite every share document it is in."""
        started = time.monotonic()
        if started - self._renewed_at < self._heartbeat_s:
            return
        try:
            async with self._store.gate.guard("cap shares lease", self._lease_left_s()):
                await self._store.beat(self.instance, self._component, self._lease_s, {})
        except (PyMongoError, MongoUnavailable):
            return  # the beat tells of MongoDB's state, and falls back when the lease ends
        self._renewed(started)

    def _lease_left_s(self) -> float:
        """How long MongoDB may take to renew the lease: what is left of it, or a whole lease
        once it has ended."""
        left = self._lease_until - time.monotonic()
        return left if left > 0 else self._lease_s

    def _renewed(self, started: float) -> None:
        self._renewed_at = started
        self._lease_until = max(self._lease_until, started + self._lease_s)

    def _next_beat_in_s(self) -> float:
        """Sooner while a limit holds pushes back that its cap would allow: the room the
        others give up reaches this process within a quarter of a heartbeat, not a whole one
        (reads only; a write still happens only when a share or demand changes)."""
        for key, share in self._slots.items():
            if share.waiting and share.limit < self._caps.get(key, 0):
                return self._heartbeat_s * UNSETTLED_BEAT_SHARE
        return self._heartbeat_s

    async def beat(self) -> None:
        """One heartbeat: renew the lease, then settle every subscription's share."""
        started = time.monotonic()
        now = await self._store.beat(self.instance, self._component, self._lease_s,
                                     {"subscriptions": sorted(self.subscription_ids()),
                                      "circuits": self._circuit_reports(),
                                      "health_url": self.health_url})
        self._renewed(started)
        renew_s = time.monotonic() - started
        if renew_s > self._lease_s / 4:
            log.warning("cap shares: renewing the lease took %.1f s of its %.1f s", renew_s,
                        self._lease_s)
        instances = await self._store.live_instances(now)
        self._see_peers(instances)
        self._hear_circuits(instances)
        live = set(instances)
        if not self._inherited:
            self._leaving |= set(await self._store.held_by(self.instance)) - set(self._slots)
            self._inherited = True
        sub_ids = sorted(set(self._slots) | self._leaving)
        docs = await self._store.read(sub_ids)
        for sub_id in sub_ids:
            doc = docs.get(sub_id)
            for _ in range(SWAP_TRIES):
                if await self._settle(sub_id, doc, live, now):
                    break
                doc = (await self._store.read([sub_id])).get(sub_id)

    def _see_peers(self, instances: dict[str, dict[str, Any]]) -> None:
        mine = {name: doc for name, doc in instances.items()
                if doc.get("component") == self._component}
        peers = frozenset(mine) | {self.instance}
        hosted = {name: frozenset(doc.get("subscriptions", ())) for name, doc in mine.items()
                  if name != self.instance}
        if peers != self.peers:
            log.info("%s instances live: %s", self._component, ", ".join(sorted(peers)))
        changed = peers != self.peers or hosted != self.hosted
        self.peers, self.hosted = peers, hosted
        self._views += 1
        if self._views >= 2:
            self.peers_known.set()
        if changed and self.on_peers is not None:
            self.on_peers()

    def _circuit_reports(self) -> list[dict[str, Any]]:
        """The evidence of the subscriptions this process has seen an answer or a failure of:
        one never pushed to has none to tell, and a heartbeat of a process that hosts hundreds
        of idle subscriptions stays small (reading no report is reading an empty one)."""
        reports = []
        for sub_id, breaker in self._breakers.items():
            evidence = breaker.report()
            if breaker.is_open or evidence.tells():
                reports.append({"subscription": sub_id, "open": breaker.is_open,
                                **evidence.to_doc()})
        return reports

    def _hear_circuits(self, instances: dict[str, dict[str, Any]]) -> None:
        heard: dict[str, list[Evidence]] = {}
        for name, doc in instances.items():
            if name == self.instance:
                continue
            for report in doc.get("circuits", []):
                evidence = Evidence.from_doc(report)
                heard.setdefault(str(report.get("subscription")), []).append(evidence)
        for sub_id, breaker in self._breakers.items():
            breaker.hear(heard.get(sub_id, []))

    async def _settle(self, sub_id: str, doc: dict[str, Any] | None, live: set[str],
                      now: datetime) -> bool:
        """Takes this process's share of one subscription; False when another wrote first."""
        version = int(doc["version"]) if doc else 0
        entries = [e for e in (doc or {}).get("entries", []) if e.get("instance") in live]
        mine = next((e for e in entries if e["instance"] == self.instance), None)
        others = [e for e in entries if e["instance"] != self.instance]
        stale = doc is not None and len(entries) != len(doc.get("entries", []))
        slots = self._slots.get(sub_id)
        if slots is None:  # leaving
            if mine is None and not stale:
                self._leaving.discard(sub_id)
                return True
            done = await self._store.swap(sub_id, version, int((doc or {}).get("cap", 0)),
                                          others)
            if done:
                self._leaving.discard(sub_id)
            return done
        cap = self._caps[sub_id]
        demand = min(cap, slots.in_use + slots.waiting)
        demands = {e["instance"]: int(e.get("demand", 0)) for e in others} | {
            self.instance: demand}
        fair = fair_shares(cap, demands, rotation(demands, now.timestamp()))[self.instance]
        decision = decide(cap, fair, sum(int(e.get("held", 0)) for e in others), slots.in_use)
        self._pushers_seen[sub_id] = len(others) + 1
        recorded_demand = int(mine.get("demand", 0)) if mine else -1
        if (mine is None or stale or int(mine.get("held", 0)) != decision.held
                or demand_changed(recorded_demand, demand) or (doc or {}).get("cap") != cap):
            entry = {"instance": self.instance, "component": self._component,
                     "held": decision.held, "demand": demand, "in_use": slots.in_use,
                     "at": now}
            if not await self._store.swap(sub_id, version, cap, [*others, entry]):
                return False
        slots.set_limit(decision.limit)
        self._gauge(sub_id, decision.limit)
        return True

    def _gauge(self, key: str, limit: int) -> None:
        if key.endswith(RATE_SUFFIX):
            RATE_SHARE.labels(key.removesuffix(RATE_SUFFIX), self._component).set(limit)
        else:
            CAP_SHARE.labels(key, self._component).set(limit)

    def _mongo_back(self) -> None:
        if self._outage is not None:
            log.warning("cap shares: MongoDB answers again (the outage was: %s)", self._outage)
            self._outage = None

    def _mongo_lost(self, exc: Exception) -> None:
        if self._outage is None:
            self._outage = f"{type(exc).__name__}: {exc}"
            log.warning("cap shares: MongoDB unreachable (%s); keeping the shares until the "
                        "lease ends, then the cap divided by the processes last seen",
                        self._outage)
        if time.monotonic() < self._lease_until:
            return
        for sub_id, slots in self._slots.items():
            seen = self._pushers_seen.get(sub_id)  # never seen: one slot, the safe guess
            fallback = 1 if seen is None else max(1, self._caps[sub_id] // seen)
            slots.set_limit(fallback)
            self._gauge(sub_id, fallback)
