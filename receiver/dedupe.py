"""`AcceptedIds`: one message id, one publish, across every receiver replica.

Each receiver de-duplicates the ids it accepted itself within `dedupe_window_s` (its local
buffer, `msgbus.localqueue`, on the accept path). A client's re-send that reaches another
replica is caught here, on the publish path: before a batch is published, its ids are claimed
in MongoDB with one unordered `insert_many` per batch (`_id` the message id, `t` the accepting
receiver's token); an id another receiver claimed first (a different token) is not published
again. The claim is a write per publish batch, never a round trip per message or on the accept
path.

Claims live in one collection per window of message creation time
(`accepted_ids_<created_at // window>`, `msgbus/store/accepted.py`): a message and its re-sends
carry the same `created_at` (the client's), so they meet in the same collection, and a
collection two windows old is dropped whole. No TTL index: a claim stays one insert into a
collection with no index but `_id`, and expiry drops a collection instead of deleting its
documents one by one (see docs/decisions.md, "No TTL index for the cross-receiver claims").

The token names the acceptance: the buffer that holds the message (a random id kept in a file
beside it, `ORIGIN_FILE`) and its receipt time: a receiver that publishes again after a restart,
or one that adopts a dead receiver's buffer, finds its own claim and publishes; two receivers
that accept the same id in the same millisecond (receipt times are kept to the millisecond, and
a batch shares one) still differ.

A publish never waits long for its claim (a duplicate is possible, a delay of deliveries is
not): it waits WAIT_FACTOR times as long as recent claims took (at least WAIT_MIN_S), then
publishes unchecked and leaves the claim running, so that a late claim still stops a later
re-send elsewhere (a hedged request, as in "The Tail at Scale"). While a late claim runs, the
next batches do not claim: they are published unchecked at once. The claim itself goes through
the store's gate (`msgbus.store.gate`): after CLAIM_TIMEOUT_S it closes the gate, and no claim
is tried until a probe finds MongoDB back. So a hung MongoDB costs the publish path one short
wait, not one timeout per batch. `msgbus_dedupe_unchecked_total` counts what is published
unchecked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from datetime import datetime
from pathlib import Path

from pymongo.errors import PyMongoError

from msgbus.errors import MongoUnavailable
from msgbus.metrics import DEDUPE_UNCHECKED, MESSAGES_DUPLICATE
from msgbus.models import Envelope, utcnow
from msgbus.store import MongoStore
from msgbus.tasks import detached_task

log = logging.getLogger(__name__)

CLAIM_TIMEOUT_S = 2.0  # then MongoDB is taken as unavailable: the gate closes
WAIT_MIN_S = 0.25  # a publish waits for its claim at least this long,
WAIT_FACTOR = 4.0  # or this many times the recent claims' time (the longer)
SMOOTHING = 0.2  # weight of the newest claim in the recent claims' time
WINDOWS_KEPT = 2  # the current window's collection and this many before it


ORIGIN_FILE = "accept-origin"


def buffer_origin(buffer_dir: Path) -> str:
    """The random id of a receiver buffer, made the first time it is asked for."""
    path = buffer_dir / ORIGIN_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        origin = secrets.token_hex(8)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(origin)
        os.replace(tmp, path)  # two openers at once: one file wins, and both read it below
        return path.read_text().strip()


def accept_token(origin: str, envelope: Envelope) -> str:
    """Which acceptance of the message this is: its buffer and its receipt time."""
    return f"{origin}:{int(envelope.accepted_at.timestamp() * 1000)}"


class AcceptedIds:
    def __init__(self, store: MongoStore, window_s: float, origin: str) -> None:
        """`origin`: the id of the buffer whose messages this claims (`buffer_origin`)."""
        self._claims = store.accepted_ids
        self._gate = store.gate
        self._origin = origin
        self._window_s = window_s
        self._unchecked_logged = False
        self._dropped_before = 0  # windows before this one are gone
        self._claim_s: float | None = None  # how long recent claims took (smoothed)
        self._late: asyncio.Task[set[str]] | None = None  # a claim not waited for to its end

    def wait_s(self) -> float:
        """How long a publish waits for its claim: long while nothing is known."""
        if self._claim_s is None:
            return CLAIM_TIMEOUT_S
        return min(CLAIM_TIMEOUT_S, max(WAIT_MIN_S, WAIT_FACTOR * self._claim_s))

    async def first_accepts(self, envelopes: list[Envelope]) -> list[Envelope]:
        """Of the envelopes about to be published, those no other receiver accepted first."""
        if not envelopes:
            return envelopes
        if self._late is not None and not self._late.done():
            return self._unchecked(envelopes, "an earlier claim is still unanswered")
        wait_s = self.wait_s()
        claim = detached_task(self._timed_claim(envelopes))
        try:
            taken = await asyncio.wait_for(asyncio.shield(claim), wait_s)
        except TimeoutError:
            self._late = claim
            return self._unchecked(envelopes, f"MongoDB did not answer within {wait_s:.2f} s")
        except (MongoUnavailable, PyMongoError) as exc:
            return self._unchecked(envelopes, str(exc))
        self._unchecked_logged = False
        if not taken:
            return envelopes
        for envelope in envelopes:
            if envelope.message_id in taken:
                MESSAGES_DUPLICATE.labels(envelope.destination).inc()
        log.info("%d messages another receiver accepted first are not published again",
                 len(taken))
        return [e for e in envelopes if e.message_id not in taken]

    def _unchecked(self, envelopes: list[Envelope], why: str) -> list[Envelope]:
        DEDUPE_UNCHECKED.inc(len(envelopes))
        if not self._unchecked_logged:
            self._unchecked_logged = True
            log.warning("claiming message ids: %s; publishing without the cross-receiver "
                        "duplicate check until MongoDB answers", why)
        return envelopes

    async def _timed_claim(self, envelopes: list[Envelope]) -> set[str]:
        began = time.monotonic()
        async with self._gate.guard("claims", CLAIM_TIMEOUT_S):
            taken = await self._claim(envelopes)
        took_s = time.monotonic() - began
        self._claim_s = took_s if self._claim_s is None else (
            SMOOTHING * took_s + (1 - SMOOTHING) * self._claim_s)
        return taken

    def _window_of(self, moment: datetime) -> int:
        return int(moment.timestamp() // self._window_s)

    async def _claim(self, envelopes: list[Envelope]) -> set[str]:
        """Claims the ids; returns those another acceptance claimed first."""
        by_window: dict[int, list[Envelope]] = {}
        for envelope in envelopes:
            by_window.setdefault(self._window_of(envelope.created_at), []).append(envelope)
        taken: set[str] = set()
        for window, of_window in by_window.items():
            tokens = {e.message_id: accept_token(self._origin, e) for e in of_window}
            taken |= await self._claims.claim(window, tokens)
        await self._drop_old_windows()
        return taken

    async def _drop_old_windows(self) -> None:
        """Once per window: the collections of windows before the kept ones go."""
        oldest_kept = self._window_of(utcnow()) - WINDOWS_KEPT
        if oldest_kept <= self._dropped_before:
            return
        await self._claims.drop_windows_before(oldest_kept)
        self._dropped_before = oldest_kept
