"""`Notifier`: tells the team that owns a subscription what happened to it, on the team's
webhook (`notify_url`): a CloudEvent, signed as pushes are (Standard Webhooks, with the team's
`notify_secret`), with a link to the subscription's page.

    msgbus.circuit.opened / .closed        the circuit of its subscriber (any process's breaker)
    msgbus.messages.parked                 the first message parked (the retry policy gave up)
                                           after a quiet cool-down without any parked
    msgbus.delivery.late                   the oldest undelivered message is older than the
                                           subscription's objective (delay_s +
                                           delivery_objective_s)
    msgbus.subscription.paused / .deleted  by someone who is not in the team
    msgbus.subscription_request.created    another team asks to subscribe (to the
                                           destination's team)

Several processes see the same event (every dispatcher's and compensator's breaker opens):
each claims it in MongoDB (`NotificationStore.claim`) and only the first within the cool-down
(`MSGBUS_NOTIFY_COOLDOWN_S`, 10 min) tells it, so a flapping circuit is told once per
cool-down; a parked message is told only when none was parked in the cool-down before
(`first_after_quiet`). Events a process sees again and again (every parked outcome, every
backlog check of a late subscription) are passed on at most every `REPEAT_EVERY_S` per
process, so the claims cost MongoDB little. Telling never holds up a push: `emit` queues the
event and returns; a task sends it, a few tries with backoff, and records what came of it
(the team's recent notifications).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from msgbus.backoff import backoff_s
from msgbus.delivery.sender import Sender
from msgbus.delivery.signing import sign
from msgbus.errors import NotFound
from msgbus.ids import uuid7
from msgbus.models import DeliveryOutcome, utcnow
from msgbus.sealing import SecretKeys
from msgbus.store import MongoStore
from msgbus.store.notifications import NotificationStore
from msgbus.tasks import cancel_and_wait

log = logging.getLogger(__name__)

TRIES = 3
TIMEOUT_S = 5.0
MAX_QUEUED = 10_000  # events beyond are dropped (logged): telling must never grow memory
REPEAT_EVERY_S = 30.0  # a repeated event is passed on to the claim at most this often


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # e.g. "circuit.opened"
    subscription: str  # "code/name"
    details: dict[str, Any] = field(default_factory=dict)
    team: str | None = None  # who is told; None: the subscription's team
    after_quiet: bool = False  # told only when not seen in the cool-down before


class Notifier:
    def __init__(self, store: MongoStore, sender: Sender, keys: SecretKeys, *, component: str,
                 ui_url: str = "", cooldown_s: float = 600.0) -> None:
        self._store = store
        self._sender = sender  # a push client: the same egress policy as pushes
        self._keys = keys  # open the team's sealed notify secret
        self._told = NotificationStore(store)
        self._component = component
        self._ui_url = ui_url.rstrip("/")
        self._cooldown_s = cooldown_s
        self._queue: asyncio.Queue[Event] = asyncio.Queue(MAX_QUEUED)
        self._task: asyncio.Task[None] | None = None
        self._passed_on: dict[tuple[str, str], float] = {}  # (kind, subscription) -> when
        self._repeat_every_s = min(REPEAT_EVERY_S, cooldown_s / 4)  # well within a quiet time

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="notifier")

    async def close(self) -> None:
        await cancel_and_wait(self._task)

    def emit(self, kind: str, subscription: str, details: dict[str, Any] | None = None,
             team: str | None = None) -> None:
        """Queues the event; returns at once."""
        self._queue_event(Event(kind, subscription, details or {}, team))

    def _queue_event(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            log.warning("notifier: %d events queued; %s of %s not told", MAX_QUEUED,
                        event.kind, event.subscription)

    def circuit_changed(self, subscription: str, is_open: bool) -> None:
        """For a breaker's `on_change`."""
        self.emit("circuit.opened" if is_open else "circuit.closed", subscription,
                  {"seen_by": self._component})

    def saw_outcomes(self, outcomes: Iterable[DeliveryOutcome]) -> None:
        """For outcomes once recorded: a parked one may be the first after a quiet time."""
        for outcome in outcomes:
            if outcome.parked:
                result = outcome.result
                self._emit_repeated(Event(
                    "messages.parked", result.subscription,
                    {"message_id": result.message_id, "attempt": result.attempt,
                     "status_code": result.status_code, "error": result.error,
                     "seen_by": self._component}, after_quiet=True))

    def delivery_late(self, subscription: str, oldest_age_s: float, late_after_s: float) -> None:
        """For a backlog check that found the oldest undelivered message past the objective."""
        self._emit_repeated(Event("delivery.late", subscription,
                                  {"oldest_age_s": round(oldest_age_s, 1),
                                   "late_after_s": late_after_s, "seen_by": self._component}))

    def _emit_repeated(self, event: Event) -> None:
        key = (event.kind, event.subscription)
        now = time.monotonic()
        if now - self._passed_on.get(key, -self._repeat_every_s) < self._repeat_every_s:
            return
        self._passed_on[key] = now
        self._queue_event(event)

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._tell(event)
            except Exception:  # a notification must never stop the next one
                log.exception("notifier: telling %s of %s failed", event.kind,
                              event.subscription)

    async def _tell(self, event: Event) -> None:
        claim = self._told.first_after_quiet if event.after_quiet else self._told.claim
        if not await claim(event.kind, event.subscription, self._cooldown_s):
            return  # told already, by this process or another, within the cool-down
        team = event.team or await self._team_of(event.subscription)
        if team is None:
            return
        try:
            target = await self._store.teams.get(team)
        except NotFound:
            target = None
        if target is None or not target.notify_url or not target.notify_secret:
            outcome = "no target: the team has no notify_url"
        else:
            outcome = await self._post(target.notify_url, self._keys.open(target.notify_secret),
                                       team, event)
        await self._told.record(team, event.kind, event.subscription, event.details, outcome)

    async def _team_of(self, subscription: str) -> str | None:
        code, _, name = subscription.partition("/")
        try:
            return await self._store.config.subscription_team(code, name)
        except NotFound:
            return None

    async def _post(self, url: str, secret: str, team: str, event: Event) -> str:
        event_id = uuid7()
        code, _, name = event.subscription.partition("/")
        link = f"{self._ui_url}/ui/subscriptions/{code}/{name}" if self._ui_url else None
        body = orjson.dumps({"kind": event.kind, "team": team,
                             "subscription": event.subscription, "link": link,
                             "details": event.details})
        for tries in range(1, TRIES + 1):
            timestamp = int(time.time())
            headers = {
                "content-type": "application/json", "ce-specversion": "1.0",
                "ce-id": event_id, "ce-source": "msgbus", "ce-type": f"msgbus.{event.kind}",
                "ce-time": utcnow().isoformat().replace("+00:00", "Z"),
                "ce-subject": event.subscription, "webhook-id": event_id,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": sign([secret], event_id, timestamp, body)}
            status, error = await self._sender.post(url, body, headers, TIMEOUT_S)
            if error is None:
                return f"told ({status})"
            why = error if status is None else f"answered {status}"
            if tries < TRIES:
                await asyncio.sleep(backoff_s(failures=tries, first_s=1.0, max_s=10.0))
        log.warning("notifier: %s of %s not told to team %s: %s", event.kind,
                    event.subscription, team, why)
        return f"not told: {why}"
