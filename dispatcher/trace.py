"""`TraceWriter`: records delivery outcomes durably on local disk first, then in MongoDB in
batches, so that a MongoDB outage never stops deliveries and a crash never loses a trace."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from msgbus.flush import Flusher
from msgbus.localqueue import LocalQueue
from msgbus.models import AttemptResult, DeliveryOutcome
from msgbus.store import MongoStore

QUEUE = "outcomes"


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


def encode_outcome(outcome: DeliveryOutcome) -> bytes:
    r = outcome.result
    return orjson.dumps({
        "m": r.message_id, "s": r.subscription, "n": r.attempt, "t": r.started_at,
        "l": r.latency_ms, "c": r.status_code, "e": r.error, "i": r.instance,
        "ra": r.retry_after_s, "d": outcome.destination, "ca": outcome.created_at,
        "b": outcome.biz_id, "na": outcome.next_attempt_at, "p": outcome.parked,
        "rp": outcome.retrying_in_place, "sk": outcome.skipped, "bi": r.batch_id,
        **({} if outcome.scheduled_for is None else {"sf": outcome.scheduled_for}),
        **({} if r.answer is None else {"an": r.answer}),  # a failed push's kept answer
    })


def decode_outcome(data: bytes) -> DeliveryOutcome:
    d: dict[str, Any] = orjson.loads(data)
    started, created = _dt(d["t"]), _dt(d["ca"])
    assert started is not None and created is not None
    result = AttemptResult(
        message_id=d["m"], subscription=d["s"], attempt=d["n"], started_at=started,
        latency_ms=d["l"], status_code=d["c"], error=d["e"], instance=d["i"],
        retry_after_s=d["ra"], batch_id=d.get("bi"), answer=d.get("an"),
    )
    return DeliveryOutcome(result=result, destination=d["d"], created_at=created,
                           biz_id=d["b"], next_attempt_at=_dt(d["na"]), parked=d["p"],
                           retrying_in_place=d.get("rp", False), skipped=d.get("sk", False),
                           scheduled_for=_dt(d.get("sf")))


class TraceWriter:
    def __init__(self, buffer: LocalQueue, store: MongoStore, *, batch_size: int) -> None:
        self._buffer = buffer
        self._store = store
        self._flusher = Flusher(buffer, QUEUE, self._write, batch_size=batch_size,
                                ready=store.gate.wait_available)
        # told of every outcome once it is durable here (the notifier looks for parked ones)
        self.on_recorded: Callable[[list[DeliveryOutcome]], None] = lambda _: None

    def start(self) -> None:
        self._flusher.start()

    async def close(self) -> None:
        await self._flusher.close()

    async def record(self, outcomes: list[DeliveryOutcome]) -> None:
        """Returns once the outcomes are durable locally: one write, its fsync shared with
        concurrent calls."""
        await self._buffer.append([(QUEUE, encode_outcome(o)) for o in outcomes])
        self.on_recorded(outcomes)

    def backlog(self) -> int:
        return self._buffer.depth(QUEUE)

    def waiting(self, limit: int) -> list[DeliveryOutcome]:
        """Up to `limit` of the oldest outcomes not yet written to MongoDB."""
        return [decode_outcome(value) for _, value in self._buffer.read(QUEUE, limit)]

    async def flush(self) -> None:
        while await self._flusher.flush_once():
            pass

    async def _write(self, entries: list[bytes]) -> None:
        await self._store.records.record_outcomes([decode_outcome(e) for e in entries])
