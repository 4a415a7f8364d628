"""`ReplayRunner`: runs the operators' replay jobs — re-delivers a destination's messages of a
time range to chosen subscriptions, at the job's own rate limit and with its own concurrency
slots, apart from live traffic and from the retries.

A job goes page by page through its messages in (created_at, id) order; after each page it
records the attempts, saves its position and progress (renewing its lease) and reads its state,
so a pause or a cancel takes effect within about a page (about a second at the job's rate). A
compensator that dies mid-page leaves the job to another one, which starts again at the saved
position: pushes of that one page may be repeated, nothing is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from msgbus.delivery.attempt import outcome_of, push_batch_through, push_through
from msgbus.delivery.batch import BatchPush, batches_of
from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.sender import Sender
from msgbus.delivery.shares import CapShares
from msgbus.errors import NotFound
from msgbus.metrics import REPLAY_DONE, REPLAY_PLANNED
from msgbus.models import DeliveryOutcome, Envelope, ReplaySpec, ReplayState, Subscription
from msgbus.ratelimit import TokenBucket
from msgbus.registry import Registry
from msgbus.settings import CompensatorSettings
from msgbus.store import MongoStore
from msgbus.store.documents import envelope_from_doc
from msgbus.store.replays import ReplayStore
from msgbus.tasks import PeriodicWork

log = logging.getLogger(__name__)

MAX_PAGE_MESSAGES = 200
BASE_LEASE_S = 60.0
ERROR_PAUSE_S = 2.0


class ReplayRunner(PeriodicWork):
    def __init__(self, store: MongoStore, registry: Registry, sender: Sender,
                 settings: CompensatorSettings, shares: CapShares, *, owner: str) -> None:
        super().__init__()
        self._store = store
        self._shares = shares
        self.jobs = ReplayStore(store)
        self._registry = registry
        self._sender = sender
        self._settings = settings
        self._owner = owner
        self._indexed = False
        self.every(settings.replay_poll_s, self._run_next, what="replays",
                   again_while_busy=True)

    async def _run_next(self) -> bool:
        """Runs the next job that is to run, if any; True when it ran one (the next is looked
        for at once)."""
        if not self._indexed:
            await self.jobs.ensure_indexes()
            self._indexed = True
        try:
            job = await self.jobs.claim_running(self._owner, BASE_LEASE_S)
            if job is None:
                return False
            await ReplayJobRun(job, self.jobs, self._store, self._registry, self._sender,
                               self._shares, owner=self._owner, closing=self._closing).run()
            return True
        except Exception:
            log.exception("replays: running a job failed; trying again")
            await asyncio.sleep(ERROR_PAUSE_S)
            return False


class ReplayJobRun:
    """One compensator's run of one job, from its saved position until it is done, paused,
    cancelled or taken away."""

    def __init__(self, job: dict[str, Any], jobs: ReplayStore, store: MongoStore,
                 registry: Registry, sender: Sender, shares: CapShares, *, owner: str,
                 closing: asyncio.Event) -> None:
        self._jobs, self._store, self._registry = jobs, store, registry
        self._sender, self._shares = sender, shares
        self._owner, self._closing = owner, closing
        self.job_id: str = job["_id"]
        self.spec = ReplaySpec.model_validate(job["spec"])
        self.sub_ids: list[str] = job["subscriptions"]
        self.position: dict[str, Any] | None = job["position"]
        self._bucket = TokenBucket(self.spec.rate_per_s)
        self._limiters: dict[str, SubscriptionLimiter] = {}
        self._done = REPLAY_DONE.labels(self.job_id)
        self._done.set(job["done"])
        REPLAY_PLANNED.labels(self.job_id).set(job["planned"])
        self._done_so_far = int(job["done"])

    async def run(self) -> None:
        log.info("replay %s: running from %s", self.job_id, self.position or "the start")
        while not self._closing.is_set():
            live = await self._live_subscriptions()
            page = await self._jobs.message_page(self.spec, self.position,
                                                   self._page_size(list(live.values())))
            if not page:
                await self._jobs.finish(self.job_id, self._owner, self._done_so_far)
                log.info("replay %s: done, %d pushes", self.job_id, self._done_so_far)
                return
            pairs = await self._pairs(page)
            made = await self._push_page(pairs, live)
            await self._store.records.record_outcomes(made)
            if self._closing.is_set():  # part of the page was not pushed: redo it next time
                await self._jobs.release(self.job_id, self._owner)
                return
            last = page[-1]
            self.position = {"created_at": last["created_at"], "_id": last["_id"]}
            delivered = sum(1 for o in made if o.result.ok)
            self._done_so_far += len(pairs)
            self._done.set(self._done_so_far)
            state = await self._jobs.save_progress(
                self.job_id, self._owner, self._lease_s(list(live.values())),
                position=self.position, done=len(pairs), delivered=delivered,
                failed=len(made) - delivered)
            if state != ReplayState.RUNNING.value:
                log.info("replay %s: %s; stopping", self.job_id, state or "taken over")
                if state is not None:
                    await self._jobs.release(self.job_id, self._owner)
                return

    async def _live_subscriptions(self) -> dict[str, Subscription]:
        """The job's subscriptions that still exist. One this compensator's registry does not
        know yet (created within a refresh) is read from MongoDB: only one MongoDB does not
        have either is gone, else its pushes would be counted done without being made."""
        live: dict[str, Subscription] = {}
        for sid in self.sub_ids:
            sub = self._registry.subscription(sid)
            if sub is None:
                with contextlib.suppress(NotFound):
                    sub = await self._store.config.get_subscription(sid)
            if sub is not None:
                live[sid] = sub
        return live

    def _page_size(self, subs: list[Subscription]) -> int:
        """About a second of pushes at the job's rate, and no more than four rounds of the
        smallest concurrency limit, so a pause is noticed soon and the lease holds."""
        per_message = max(1, len(self.sub_ids))
        by_rate = int(self.spec.rate_per_s / per_message)
        by_slots = 4 * min((s.max_concurrency for s in subs), default=1) // per_message
        return max(1, min(MAX_PAGE_MESSAGES, by_rate, by_slots))

    def _lease_s(self, subs: list[Subscription]) -> float:
        slowest_s = max((s.timeout_ms / 1000 for s in subs), default=0.0)
        return BASE_LEASE_S + 4 * slowest_s

    async def _pairs(self, page: list[dict[str, Any]]) -> list[tuple[Envelope, str]]:
        envelopes = [envelope_from_doc(m) for m in page]
        pairs = [(env, sid) for env in envelopes for sid in self.sub_ids]
        if self.spec.statuses is None:
            return pairs
        states = await self._jobs.delivery_states(page, self.sub_ids)
        wanted = set(self.spec.statuses)
        return [(env, sid) for env, sid in pairs
                if states.get(f"{env.message_id}|{sid}") in wanted]

    async def _push_page(self, pairs: list[tuple[Envelope, str]],
                         live: dict[str, Subscription]) -> list[DeliveryOutcome]:
        """The outcomes of the pushes made: batch subscriptions get batch pushes (in page
        order), the others a push per message."""
        batched = {sid for sid, sub in live.items() if sub.batched}
        pushes: list[Coroutine[Any, Any, list[DeliveryOutcome]]] = [
            self._push_batch(live[sid], batch) for sid in batched
            for batch in batches_of(((env, 1) for env, s in pairs if s == sid), live[sid])]
        singles = await asyncio.gather(*(
            self._push(live[sid], env) if sid in live else self._gone(sid)
            for env, sid in pairs if sid not in batched), *pushes)
        made: list[DeliveryOutcome] = []
        for outcome in singles:
            if isinstance(outcome, list):
                made += outcome
            elif outcome is not None:
                made.append(outcome)
        return made

    async def _push_batch(self, sub: Subscription, batch: BatchPush) -> list[DeliveryOutcome]:
        limiter = self._limiter(sub)
        if not await limiter.acquire(self._closing):
            return []
        try:  # the job's rate counts messages, batched or not
            for _ in range(len(batch)):
                await self._bucket.take_one()
        except BaseException:
            limiter.release(None)
            raise
        results = await push_batch_through(limiter, self._sender, batch, sub)
        outcomes = []
        for result, envelope in zip(results, batch.envelopes, strict=True):
            result.instance = f"{result.instance} replay {self.job_id}"
            outcomes.append(outcome_of(result, envelope, sub, attempts_so_far=1))
        return outcomes

    def _limiter(self, sub: Subscription) -> SubscriptionLimiter:
        limiter = self._limiters.get(sub.id)
        if limiter is None:
            limiter = self._limiters[sub.id] = self._shares.limiter(sub)
        return limiter

    async def _push(self, sub: Subscription, envelope: Envelope) -> DeliveryOutcome | None:
        limiter = self._limiter(sub)
        if not await limiter.acquire(self._closing):
            return None
        try:  # the job's rate token last, right before the push: a wait for a slot (the
            # process's share of the cap) must not bunch the tokens taken before it
            await self._bucket.take_one()
        except BaseException:
            limiter.release(None)
            raise
        result = await push_through(limiter, self._sender, envelope, sub, 1)
        result.instance = f"{result.instance} replay {self.job_id}"
        return outcome_of(result, envelope, sub, attempts_so_far=1)

    async def _gone(self, sub_id: str) -> None:
        """The subscription was deleted after the job was created: nothing to push."""
        log.debug("replay %s: subscription %s no longer exists", self.job_id, sub_id)
