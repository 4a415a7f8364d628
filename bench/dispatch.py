"""Dispatcher benchmark (issue 5): pushes/s of one dispatcher process against a raw aiohttp push
loop, the isolation ratio of a healthy subscriber among bad neighbours, and accepted →
subscriber latency at half of the measured capacity.

    python -m bench.dispatch [--runs 3] [--messages 10000] [--isolation-messages 5000]
                             [--latency-s 10] [--push-concurrency 16] [--auth-messages 15000]
                             [--only-auth] [--quick]

Everything runs on 127.0.0.1 in processes of its own (bench/dispatch_stack.py): tansu,
SecantusDB, one `msgbus receiver`, one `msgbus dispatcher`, two subscriber processes and one
load-generator process, and for the auth phase (bench/dispatch_auth.py) two https subscriber
processes and the tests' OAuth2 server (node, tests/tools/oauth2-server.mjs); all are stopped by
PID at the end, also on Ctrl-C, SIGTERM or an error.

Per run (runs are interleaved, and the order of the paired phases swaps on even runs, so
machine noise hits both sides of every ratio alike):

1. Pre-load, through the real receiver (batched POSTs), N messages into a "capacity" Kafka
   destination and M into an "alone" and a "neighbours" destination, every subscription still
   paused; then wait until the receiver has published and recorded everything.
2. raw: the load process POSTs the same N bodies straight to the subscriber, with as many
   requests in flight as the subscription's max_concurrency.
   capacity: resume the one subscription; the dispatcher pushes the backlog to the same
   subscriber. Both rates are (N - 1) ÷ (last arrival - first arrival) at the subscriber, so
   the dispatcher's start and group join are not counted. ratio = dispatcher ÷ raw.
   CPU: the dispatcher's /proc CPU time from resume until its trace is written, and the load
   process's own CPU time, per 1000 pushes; "busy" is the dispatcher's CPU seconds per second
   between the first and the last arrival (1.0 = one core).
3. isolation: resume A alone (healthy) on "alone"; then A, B (never answers: the push ends in
   the 1 s timeout), C (500 at once) and D (300 ms per request) on "neighbours", all with the
   same max_concurrency and a 1 s timeout. A's rate as above; isolation ratio = A with the
   neighbours ÷ A alone. B, C and D are paused again once A has everything (no compensator
   runs: their failures are only recorded). Their push rates meanwhile are their request
   counts at the subscriber ÷ A's delivery window.
4. replicas: a subscription capped at `--replicas-cap` (32) pushing to a subscriber that answers
   in 20 ms, a backlog of `--replicas-messages` each: first one dispatcher, then three (two more
   processes started for this phase, stopped after) on a destination of its own. Rates as in
   capacity, over the middle 80% of arrivals; the subscriber counts the most pushes it had at
   once. replicas ratio = three ÷ min(one * 3, cap ÷ 20 ms): what three processes sharing one
   cap achieve of what they could (the cap shares, msgbus/delivery/shares.py). On two cores
   three processes do not triple one, so the same three also push a subscription whose cap
   (3 x the cap) does not bind: the machine's own ceiling for three dispatchers, and
   replicas ratio to the machine = three ÷ min(that, cap ÷ 20 ms).
5. latency: resume a subscription on an empty destination, warm it up, then send single
   messages through the receiver at half of this run's dispatcher rate for `--latency-s`
   seconds. Latency = arrival at the subscriber - the moment the load process got the
   receiver's 202 (one machine, one clock; a rare negative value is kept).
6. auth (issue 40): four kinds of subscription, each with a backlog of `--auth-messages` split
   over two destinations of its own: plain (http, no auth), oauth2 (client credentials from the
   OAuth2 server, tokens living `--auth-token-ttl-s`; the same http subscriber process, which
   does not check the token), https (server TLS only: the subscription trusts the benchmark's
   CA) and mtls (a client certificate too, which that subscriber requires). One subscription
   is resumed at a time, in the order A B C D D C B A (the other way round on even runs), so a
   drift within a run weighs on every kind alike. Rates as in capacity, over both halves
   (arrivals less one per half ÷ the two first-to-last spans added up); ratios oauth2 ÷ plain
   (goal ≥ 0.9: the token is fetched once per process and renewed shortly before it expires),
   mtls ÷ plain, and mtls ÷ https (the client certificate's cost, TLS's own apart); token
   fetches = "issued" lines of the OAuth2 server while the oauth2 subscription pushed (the
   first of each half comes before its first arrival, outside the rate's window); the
   dispatcher's CPU per 1000 pushes of each kind while it pushes (from the first poll that saw
   arrivals to the last; not the trace writes after). `--only-auth` runs this phase alone (its
   pre-load and nothing else): a few minutes.
Between phases it waits until the receiver's buffer and the dispatcher's trace backlog are
empty. Progress goes to stderr; per-run lines, a min/median/max table and, as the last line,
one JSON object go to stdout. Problems (missing messages, failed requests) make the exit code
1; a missed goal does not.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from msgbus_devtools.testkit.waiting import NotInTime, eventually

from bench import cli, dispatch_auth, dispatch_load
from bench.dispatch_auth import AUTH_KINDS, AuthTargets
from bench.dispatch_report import RunFigures, json_figures, summarize, table
from bench.dispatch_stack import DispatchStack
from bench.dispatch_subscriber import PACED_S
from bench.procs import stop_process
from bench.report import out, out_json, out_lines, say
from bench.tracing_cost import hook_costs_us

ISOLATION_TIMEOUT_MS = 1000
WARMUP_MESSAGES = 50
LATENCY_BASE_N = 1_000_000  # message numbers of the measured latency load start here
REPLICA_PARTITIONS = 6  # the replicas phase's topics: two each for three dispatchers
# the OAuth2 tokens' lifetime: short enough that the dispatcher renews its token within each
# half of the oauth2 backlog (7,500 pushes: ~2-3 s here), not only before the first push: a
# 3 s token is renewed 1.3 s before it expires (msgbus/delivery/authenticator.py), every 1.7 s
AUTH_TOKEN_TTL_S = 3


def window(records: list[tuple[int, float, float]]) -> tuple[float, float]:
    arrivals = [a for _, _, a in records]
    return (min(arrivals), max(arrivals)) if arrivals else (0.0, 0.0)


def rate_of(records: list[tuple[int, float, float]]) -> float:
    first, last = window(records)
    return (len(records) - 1) / (last - first) if len(records) > 1 and last > first else 0.0


def steady_rate_of(records: list[tuple[int, float, float]], trim: float = 0.1) -> float:
    """The rate between the arrivals at the `trim` and 1 - `trim` quantiles: without the
    start (consumer group joins) and the end (stragglers), which in a backlog of a few
    thousand messages can weigh as much as the steady part."""
    arrivals = sorted(a for _, _, a in records)
    lo, hi = int(len(arrivals) * trim), len(arrivals) - 1 - int(len(arrivals) * trim)
    span = arrivals[hi] - arrivals[lo] if hi > lo else 0.0
    return (hi - lo) / span if span > 0 else 0.0


@dataclass
class AuthTally:
    """One kind of subscription of the auth phase, over its two halves."""

    intervals: int = 0  # arrivals less one per half
    span_s: float = 0.0  # first to last arrival, per half, added up
    cpu_s: float = 0.0  # the dispatcher's, between the first and the last poll that saw pushes
    cpu_pushes: int = 0  # the pushes that arrived meanwhile
    fetches: int = 0  # tokens issued


class DispatchBench:
    def __init__(self, args: argparse.Namespace, stack: DispatchStack,
                 auth: AuthTargets | None = None) -> None:
        self.args = args
        self.s = stack
        self._auth_targets = auth  # None: no auth phase (bench.e2e uses the other phases)

    @property
    def auth_targets(self) -> AuthTargets:
        if self._auth_targets is None:
            raise RuntimeError("the auth phase needs the AuthTargets (start_auth_targets)")
        return self._auth_targets

    def sub(self, kind: str, label: str) -> str:
        base = self.s.sub_url if kind in ("hook", "paced") else self.s.neighbours_url
        return f"{base}/{kind}/{label}"

    def wait_delivered(self, what: str, label: str, count: int,
                       future: Future[dict[str, Any]] | None = None,
                       base_url: str | None = None) -> dict[str, float]:
        """Wait until the subscriber (at `base_url`, default "sub") holds messages 0..count-1
        of `label`; samples the dispatcher's CPU at the first and at the last poll that saw
        progress."""
        seen: dict[str, float] = {}
        base = base_url or self.s.sub_url

        def done() -> bool:
            self.s.check_alive()
            if future is not None and future.done() and future.exception() is not None:
                raise RuntimeError(f"{what}: the load process failed: {future.exception()!r}")
            got = self.s.count(base, label, 0, count)["unique"]
            if got and "t0" not in seen:
                seen["t0"], seen["cpu0"] = time.monotonic(), self.s.dispatcher_cpu_s()
                seen["got0"] = got
            seen["got"] = got
            if got >= count:
                seen["t1"], seen["cpu1"] = time.monotonic(), self.s.dispatcher_cpu_s()
            return got >= count

        eventually(done, self.args.timeout, what, interval_s=0.1,
                   progress=lambda: f"{seen.get('got', 0)}/{count} delivered")
        return seen

    # ---- phases ---------------------------------------------------------------------------

    def raw(self, fig: RunFigures) -> None:
        label, n = f"raw-{fig.run}", self.args.messages
        say(f"run {fig.run}: raw aiohttp loop, {n} pushes")
        cpu_before = self.s.stack_cpu_s()
        future = self.s.submit(dispatch_load.raw_push, url=self.sub("hook", label), start=0,
                               count=n, concurrency=self.args.push_concurrency,
                               deadline=time.time() + self.args.timeout)
        self.wait_delivered(f"run {fig.run} raw", label, n, future)
        result = future.result(timeout=60)
        stack_cpu_s = sum(self.s.stack_cpu_s().values()) - sum(cpu_before.values())
        fig.raw_stack_cpu_ms_per_1k = (stack_cpu_s + result["cpu_s"]) * 1e6 / n
        if result["failed"] or result["not_sent"]:
            fig.problems.append(f"raw loop: {result['failed']} failed, {result['not_sent']} "
                                "not sent")
        fig.raw_pushes_per_s = rate_of(self.s.records(self.s.sub_url, label, 0, n))
        fig.raw_cpu_ms_per_1k = result["cpu_s"] * 1e6 / n

    def capacity(self, fig: RunFigures, sub_ids: list[str]) -> None:
        label, n = f"cap-{fig.run}", self.args.messages
        say(f"run {fig.run}: dispatcher, backlog of {n} messages")
        cpu_start, stack_start = self.s.dispatcher_cpu_s(), self.s.stack_cpu_s()
        self.s.set_paused(sub_ids, False)
        seen = self.wait_delivered(f"run {fig.run} dispatcher", label, n)
        eventually(lambda: self.s.trace_backlog() == 0, self.args.timeout, "trace",
                   interval_s=0.1)
        cpu_end, stack_end = self.s.dispatcher_cpu_s(), self.s.stack_cpu_s()
        fig.stack_cpu_ms_by_role = {role: (stack_end[role] - stack_start[role]) * 1e6 / n
                                    for role in stack_start}
        self.s.set_paused(sub_ids, True)
        fig.dispatcher_pushes_per_s = rate_of(self.s.records(self.s.sub_url, label, 0, n))
        fig.dispatcher_cpu_ms_per_1k = (cpu_end - cpu_start) * 1e6 / n
        if seen["t1"] > seen["t0"]:
            fig.dispatcher_cpu_busy = (seen["cpu1"] - seen["cpu0"]) / (seen["t1"] - seen["t0"])
        self.s.wait_workers_stopped(sub_ids)

    def isolation(self, fig: RunFigures, sub_ids: list[str], *, neighbours: bool) -> None:
        label, n = f"iso-{'mixed' if neighbours else 'alone'}-{fig.run}", self.args.iso_messages
        say(f"run {fig.run}: subscriber A {'with B, C, D' if neighbours else 'alone'}, "
            f"backlog of {n}")
        self.s.set_paused(sub_ids, False)
        self.wait_delivered(f"run {fig.run} {label}", label, n)
        hits = {k: self.s.hits(self.s.neighbours_url, f"{k}-{fig.run}") for k in "bcd"}
        self.s.set_paused(sub_ids, True)
        records = self.s.records(self.s.sub_url, label, 0, n)
        rate, steady = rate_of(records), steady_rate_of(records)
        if not neighbours:
            fig.alone_pushes_per_s, fig.alone_steady_per_s = rate, steady
        else:
            fig.with_neighbours_pushes_per_s = rate
            fig.with_neighbours_steady_per_s = steady
            first, last = window(records)
            span = max(last - first, 1e-9)
            fig.neighbour_b_per_s = hits["b"] / span
            fig.neighbour_c_per_s = hits["c"] / span
            fig.neighbour_d_per_s = hits["d"] / span
        self.s.wait_workers_stopped(sub_ids)

    def replicas(self, fig: RunFigures, one: list[str], three: list[str],
                 free: list[str]) -> None:
        n = self.args.replicas_messages
        say(f"run {fig.run}: replicas, one dispatcher, backlog of {n}, cap "
            f"{self.args.replicas_cap}")
        fig.replicas_one_per_s, peak_one = self._replica_rate(fig, "rep1", one)
        more = self.s.start_more_dispatchers(2)
        try:
            say(f"run {fig.run}: replicas, three dispatchers, backlog of {n}")
            fig.replicas_three_per_s, peak_three = self._replica_rate(fig, "rep3", three)
            say(f"run {fig.run}: replicas, three dispatchers, a cap that does not bind")
            fig.replicas_free_per_s, _ = self._replica_rate(fig, "repfree", free)
        finally:
            for index, process in enumerate(more, start=1):
                self.s.stopped.add(f"dispatcher-{index}")
                stop_process(process, f"dispatcher-{index}")
        fig.replicas_peak = max(peak_one, peak_three)
        fig.replicas_cap = self.args.replicas_cap

    def _replica_rate(self, fig: RunFigures, kind: str, sub_ids: list[str]) -> tuple[float, int]:
        label, n = f"{kind}-{fig.run}", self.args.replicas_messages
        self.s.set_paused(sub_ids, False)
        self.wait_delivered(f"run {fig.run} {label}", label, n)
        self.s.set_paused(sub_ids, True)
        rate = steady_rate_of(self.s.records(self.s.sub_url, label, 0, n))
        peak = self.s.peak(self.s.sub_url, label)
        self.s.wait_workers_stopped(sub_ids)
        return rate, peak

    def latency(self, fig: RunFigures, code: str, sub_ids: list[str]) -> None:
        label = f"lat-{fig.run}"
        rate = fig.dispatcher_pushes_per_s / 2
        count = max(1, int(rate * self.args.latency_s))
        url = f"{self.s.receiver_url}/v1/destinations/{code}/messages"
        self.s.set_paused(sub_ids, False)
        say(f"run {fig.run}: latency, warming up the subscription")
        warm = self.s.submit(dispatch_load.paced_send, url=url, api_key=self.s.api_key, start=0,
                             count=WARMUP_MESSAGES, rate_per_s=50.0, concurrency=8,
                             deadline=time.time() + self.args.timeout)
        self.wait_delivered(f"run {fig.run} latency warm-up", label, WARMUP_MESSAGES, warm)
        warm.result(timeout=60)
        say(f"run {fig.run}: latency, {count} messages at {rate:,.0f}/s through the receiver")
        lo = LATENCY_BASE_N
        future = self.s.submit(dispatch_load.paced_send, url=url, api_key=self.s.api_key,
                               start=lo, count=count, rate_per_s=rate,
                               concurrency=self.args.latency_concurrency,
                               deadline=time.time() + self.args.latency_s + 30)
        result = future.result(timeout=self.args.latency_s + 90)
        accepted: dict[int, float] = result["accepted_at"]

        def delivered() -> int:
            return self.s.count(self.s.sub_url, label, lo, lo + count)["unique"]

        with contextlib.suppress(NotInTime):
            eventually(lambda: delivered() >= len(accepted), self.args.timeout,
                       f"run {fig.run} latency delivery", interval_s=0.1,
                       progress=lambda: f"{delivered()}/{len(accepted)} delivered")
        self.s.set_paused(sub_ids, True)
        arrivals = {n: a for n, _, a in self.s.records(self.s.sub_url, label, lo, lo + count)}
        fig.latencies_ms = [(arrivals[n] - t) * 1000 for n, t in accepted.items()
                            if n in arrivals]
        fig.answer_ms = result["answer_ms"]
        fig.latency_offered_per_s = rate
        fig.latency_achieved_per_s = len(accepted) / max(result["finished"] - result["started"],
                                                         1e-9)
        missing = len(accepted) - len(fig.latencies_ms)
        if missing:
            fig.problems.append(f"latency: {missing} accepted messages never delivered")
        if result["problems"] or len(accepted) < count:
            fig.problems.append(f"latency load: {count - len(accepted)} not accepted "
                                f"{result['problems']}")
        self.s.wait_workers_stopped(sub_ids)

    def auth(self, fig: RunFigures, subs: dict[str, list[list[str]]]) -> None:
        """Each kind's backlog in two halves, in the order A B C D D C B A (D C B A A B C D on
        even runs), so a drift within the run (the later a kind came in a run of A B C D, the
        slower it pushed) weighs on every kind alike. A kind's rate: its arrivals less one per
        half ÷ the seconds between the first and last arrival of each half, added up."""
        order = AUTH_KINDS if fig.run % 2 else AUTH_KINDS[::-1]
        tally = {kind: AuthTally() for kind in AUTH_KINDS}
        for half, kinds in enumerate((order, order[::-1])):
            for kind in kinds:
                self._auth_half(fig, kind, half, subs[kind][half], tally[kind])
                self.s.wait_quiet(f"run {fig.run}", self.args.timeout)
        for kind, t in tally.items():
            setattr(fig, f"auth_{kind}_per_s", t.intervals / t.span_s if t.span_s else 0.0)
            setattr(fig, f"auth_{kind}_cpu_ms_per_1k",
                    t.cpu_s * 1e6 / t.cpu_pushes if t.cpu_pushes else math.nan)
        fig.auth_token_fetches = float(tally["oauth2"].fetches)

    def _auth_half(self, fig: RunFigures, kind: str, half: int, sub_ids: list[str],
                   tally: AuthTally) -> None:
        label, n = f"auth-{kind}-{fig.run}-{half}", self.args.auth_messages // 2
        base = self.auth_targets.base_url(kind)
        say(f"run {fig.run}: auth, {kind} subscription, half {half + 1}: backlog of {n}")
        issued = self.auth_targets.issued()
        self.s.set_paused(sub_ids, False)
        seen = self.wait_delivered(f"run {fig.run} {label}", label, n, base_url=base)
        self.s.set_paused(sub_ids, True)
        # the CPU while pushing: SecantusDB writes the trace for seconds after the last push,
        # and what the dispatcher spends meanwhile is the same for every kind
        tally.cpu_s += seen["cpu1"] - seen["cpu0"]
        tally.cpu_pushes += n - int(seen["got0"])
        # no push asks for a token while the subscription is paused
        tally.fetches += self.auth_targets.issued() - issued
        first, last = window(self.s.records(base, label, 0, n))
        tally.intervals += n - 1
        tally.span_s += last - first
        counts = self.s.count(base, label, 0, n)
        if counts["duplicates"]:
            fig.problems.append(f"auth {kind}: {counts['duplicates']} duplicate pushes")
        self.s.wait_workers_stopped(sub_ids)

    def auth_destinations(self, run: int, tag: str) -> dict[str, list[list[str]]]:
        """Two destinations per kind of the auth phase (its two halves), each with one paused
        subscription; returns their ids by kind (pre-load them with `preload_auth`)."""
        return {kind: [self.s.create(
            f"dispatch-{tag}-auth-{kind}-{half}",
            {"a": f"{self.auth_targets.base_url(kind)}/hook/auth-{kind}-{run}-{half}"},
            concurrency=self.args.push_concurrency, timeout_ms=5000,
            auth=self.auth_targets.auth(kind)) for half in (0, 1)] for kind in AUTH_KINDS}

    def preload_auth(self, tag: str) -> None:
        for kind in AUTH_KINDS:
            for half in (0, 1):
                self.s.preload(f"dispatch-{tag}-auth-{kind}-{half}", 0,
                               self.args.auth_messages // 2)

    def isolation_destinations(self, run: int, tag: str) -> tuple[list[str], list[str]]:
        """The "alone" (A) and "neighbours" (A, B, C, D) destinations of the isolation phases,
        their subscriptions paused and their backlogs pre-loaded; returns both lists of
        subscription ids."""
        def create(name: str, subscribers: dict[str, str]) -> list[str]:
            return self.s.create(f"dispatch-{tag}-{name}", subscribers,
                                 concurrency=self.args.push_concurrency,
                                 timeout_ms=ISOLATION_TIMEOUT_MS)

        alone = create("alone", {"a": self.sub("hook", f"iso-alone-{run}")})
        mixed = create("mixed", {"a": self.sub("hook", f"iso-mixed-{run}"),
                                 "b": self.sub("hang", f"b-{run}"),
                                 "c": self.sub("fail", f"c-{run}"),
                                 "d": self.sub("slow", f"d-{run}")})
        self.s.preload(f"dispatch-{tag}-alone", 0, self.args.iso_messages)
        self.s.preload(f"dispatch-{tag}-mixed", 0, self.args.iso_messages)
        return alone, mixed

    # ---- one run --------------------------------------------------------------------------

    def run_auth_only(self, run: int) -> RunFigures:
        """`--only-auth`: the auth phase and its pre-load."""
        fig = RunFigures(run)
        tag = f"{self.s.run_id}-r{run}"
        auth = self.auth_destinations(run, tag)
        say(f"run {run}: pre-loading 4 x {self.args.auth_messages} messages through the "
            "receiver (two destinations of half of them each)")
        began = time.monotonic()
        self.preload_auth(tag)
        accepted_s = time.monotonic() - began
        settled_s = self.s.wait_quiet(f"run {run} pre-load", self.args.timeout * 2)
        say(f"run {run}: pre-load accepted in {accepted_s:.1f} s, published and recorded "
            f"{settled_s:.1f} s later")
        self.auth(fig, auth)
        return fig

    def run_once(self, run: int) -> RunFigures:
        a = self.args
        if a.only_auth:
            return self.run_auth_only(run)
        fig = RunFigures(run)
        tag = f"{self.s.run_id}-r{run}"

        def create(name: str, subscribers: dict[str, str], timeout_ms: int = 5000) -> list[str]:
            return self.s.create(f"dispatch-{tag}-{name}", subscribers,
                                 concurrency=a.push_concurrency, timeout_ms=timeout_ms)

        cap = create("cap", {"a": self.sub("hook", f"cap-{run}")})
        lat = create("lat", {"a": self.sub("hook", f"lat-{run}")})
        replicas = {kind: self.s.create(
            f"dispatch-{tag}-{kind}", {"a": self.sub("paced", f"{kind}-{run}")},
            concurrency=a.replicas_cap * (3 if kind == "repfree" else 1), timeout_ms=5000,
            partitions=REPLICA_PARTITIONS) for kind in ("rep1", "rep3", "repfree")}
        auth = self.auth_destinations(run, tag)
        say(f"run {run}: pre-loading {a.messages} + 2 x {a.iso_messages} + 3 x "
            f"{a.replicas_messages} + 4 x {a.auth_messages} messages through the receiver")
        began = time.monotonic()
        self.s.preload(f"dispatch-{tag}-cap", 0, a.messages)
        alone, mixed = self.isolation_destinations(run, tag)
        for kind in replicas:
            self.s.preload(f"dispatch-{tag}-{kind}", 0, a.replicas_messages)
        self.preload_auth(tag)
        accepted_s = time.monotonic() - began
        settled_s = self.s.wait_quiet(f"run {run} pre-load", a.timeout * 2)
        say(f"run {run}: pre-load accepted in {accepted_s:.1f} s, published and recorded "
            f"{settled_s:.1f} s later")

        swap = run % 2 == 0
        for step in (("capacity", "raw") if swap else ("raw", "capacity")):
            if step == "raw":
                self.raw(fig)
            else:
                self.capacity(fig, cap)
            self.s.wait_quiet(f"run {run}", a.timeout)
        for neighbours in ((True, False) if swap else (False, True)):
            self.isolation(fig, mixed if neighbours else alone, neighbours=neighbours)
            self.s.wait_quiet(f"run {run}", a.timeout)
        self.replicas(fig, replicas["rep1"], replicas["rep3"], replicas["repfree"])
        self.s.wait_quiet(f"run {run}", a.timeout)
        self.latency(fig, f"dispatch-{tag}-lat", lat)
        self.s.wait_quiet(f"run {run}", a.timeout)
        self.auth(fig, auth)
        return fig


def tracing_figures(cpu_us_per_push: float) -> dict[str, float]:
    """The tracing hooks' cost per push (bench/tracing_cost.py), off and on, beside the
    dispatcher's CPU per push of this run (ms per 1000 pushes = µs per push)."""
    costs = hook_costs_us()
    added = {side: max(0.0, costs[side] - costs["headers"]) for side in ("off", "on")}
    shares = {side: us / cpu_us_per_push for side, us in added.items()}
    out(f"tracing hooks per push: off +{added['off']:.2f} µs ({shares['off']:.3%} of the "
        f"dispatcher's {cpu_us_per_push:.0f} µs of CPU per push), on +{added['on']:.1f} µs "
        f"({shares['on']:.1%})")
    return {"off_us": round(added["off"], 3), "on_us": round(added["on"], 2),
            "off_share": round(shares["off"], 5), "on_share": round(shares["on"], 4)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("dispatch", __doc__, runs=3)
    parser.add_argument("--messages", type=int, default=10_000,
                        help="backlog of the capacity phase, and pushes of the raw loop")
    parser.add_argument("--isolation-messages", dest="iso_messages", type=int, default=5_000,
                        help="backlog of each isolation phase")
    parser.add_argument("--latency-s", type=float, default=10.0,
                        help="seconds of paced load in the latency phase")
    parser.add_argument("--push-concurrency", type=int, default=16,
                        help="every subscription's max_concurrency, and the raw loop's "
                             "requests in flight (the product default is 16)")
    parser.add_argument("--replicas-messages", type=int, default=6_000,
                        help="backlog of each side of the replicas phase")
    parser.add_argument("--replicas-cap", type=int, default=32,
                        help="max_concurrency of the replicas phase's subscription")
    parser.add_argument("--latency-concurrency", type=int, default=64,
                        help="most requests in flight of the paced load")
    parser.add_argument("--auth-messages", type=int, default=15_000,
                        help="backlog of each kind of subscription of the auth phase, "
                             "pushed in two halves")
    parser.add_argument("--auth-token-ttl-s", type=int, default=AUTH_TOKEN_TTL_S,
                        help="lifetime of the OAuth2 server's tokens, in seconds; the "
                             "dispatcher renews one a tenth of it + 1 s (at most half of it) "
                             "before it expires")
    parser.add_argument("--only-auth", action="store_true",
                        help="run the auth phase alone (and its pre-load): a few minutes")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds any one wait may take before the run gives up")
    args = cli.parse_quick(
        parser, argv, "smoke check: 1 run, 3000 / 2000 messages, 4 s of latency load",
        runs=1, messages=3000, iso_messages=2000, latency_s=4.0, replicas_messages=2000,
        auth_messages=2000)
    if min(args.runs, args.messages, args.iso_messages, args.push_concurrency,
           args.auth_messages // 2 - 1, args.auth_token_ttl_s) < 1 or args.latency_s <= 0:
        parser.error("counts and durations must be positive")
    if (missing := dispatch_auth.missing_tools()) is not None:
        parser.error(f"the auth phase needs the tests' OAuth2 server: {missing}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work(exits: contextlib.ExitStack) -> list[RunFigures]:
        stack = DispatchStack(cli.scratch_dir(exits, "msgbus-dispatch-bench-"), exits)
        stack.start()
        auth = dispatch_auth.start_auth_targets(stack, args.auth_token_ttl_s)
        return cli.each_run(DispatchBench(args, stack, auth).run_once, args.runs)

    def report(runs: list[RunFigures], began: float) -> int:
        summary = summarize(runs)
        out_lines(table(summary))
        elapsed_s = time.monotonic() - began
        out(f"wall time {elapsed_s:.0f} s")
        config = {"runs": args.runs, "messages": args.messages, "isolation_messages":
                  args.iso_messages, "latency_s": args.latency_s,
                  "push_concurrency": args.push_concurrency,
                  "replicas_messages": args.replicas_messages,
                  "replicas_cap": args.replicas_cap, "replicas_subscriber_ms": PACED_S * 1000,
                  "isolation_timeout_ms": ISOLATION_TIMEOUT_MS,
                  "auth_messages": args.auth_messages,
                  "auth_token_ttl_s": args.auth_token_ttl_s, "only_auth": args.only_auth,
                  "elapsed_s": elapsed_s}
        figures = json_figures(summary, runs, config)
        if not args.only_auth:
            figures["tracing"] = tracing_figures(summary["dispatcher_cpu_ms_per_1k"]["median"])
        out_json(figures)
        return 1 if figures["problems"] else 0

    auth = (f"{args.auth_messages} pushes per kind of auth subscription (plain, OAuth2, https, "
            f"mTLS; in two halves), tokens living {args.auth_token_ttl_s} s")
    headline = (f"dispatch benchmark, auth phase only: {args.runs} run(s); {auth}"
                if args.only_auth else
                f"dispatch benchmark: {args.runs} run(s); {args.messages} messages for "
                f"capacity, {args.iso_messages} per isolation phase, {args.latency_s:g} s of "
                f"latency load, {auth}")
    return cli.run(f"{headline}; push concurrency {args.push_concurrency}", work, report)


if __name__ == "__main__":
    sys.exit(main())
