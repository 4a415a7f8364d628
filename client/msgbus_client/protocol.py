"""The producer -> receiver wire protocol as pure functions (no I/O).

* `single_request` / `batch_request` build the HTTP request for spooled entries.
* `interpret_single` / `interpret_batch` turn a `PostResult` into an `Outcome`: which messages are
  acknowledged (delete), rejected as invalid (move to `rejected`), or must be retried later.

Status policy: 2xx acknowledges (`accepted` or `duplicate`); 408, 429, 5xx, network errors and
malformed answers are retried; 401/403 are retried too (a wrong API key is a configuration fault,
not a fault of the message, so the messages are kept); every other 4xx rejects the message.
A whole batch refused with such a 4xx (e.g. 413 batch too large, 422 one bad item) is re-sent
one message at a time, so each message gets its own verdict.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import quote

from msgbus_client.message import Entry

BATCH_PATH = "/v1/messages"


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    path: str
    body: bytes
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class PostResult:
    """What one POST produced. `status` is None when no HTTP answer came (see `error`)."""

    status: int | None
    body: bytes = b""
    retry_after_s: float | None = None
    error: str | None = None


class Verdict(Enum):
    ACK = "ack"
    REJECT = "reject"
    RETRY = "retry"


@dataclass(slots=True)
class Outcome:
    acked: list[Entry] = field(default_factory=list)
    rejected: list[tuple[Entry, int, Any]] = field(default_factory=list)
    retry: list[Entry] = field(default_factory=list)
    retry_after_s: float | None = None
    fallback_single: bool = False
    reason: str = ""  # why messages are retried, for logs

    def merge(self, other: Outcome) -> None:
        self.acked.extend(other.acked)
        self.rejected.extend(other.rejected)
        self.retry.extend(other.retry)
        if other.retry_after_s is not None:
            self.retry_after_s = max(self.retry_after_s or 0.0, other.retry_after_s)
        self.reason = self.reason or other.reason


def single_request(entry: Entry) -> PreparedRequest:
    path = f"/v1/destinations/{quote(entry.destination, safe='')}/messages"
    return PreparedRequest(path=path, body=entry.payload, entries=(entry,))


def batch_request(entries: Sequence[Entry]) -> PreparedRequest:
    body = b'{"messages":[' + b",".join(e.batch_item() for e in entries) + b"]}"
    return PreparedRequest(path=BATCH_PATH, body=body, entries=tuple(entries))


def chunks(entries: Sequence[Entry], max_messages: int, max_bytes: int) -> Iterator[list[Entry]]:
    """Split entries into batches of at most max_messages and (unless one alone is larger)
    max_bytes of payload."""
    batch: list[Entry] = []
    size = 0
    for entry in entries:
        if batch and (len(batch) >= max_messages or size + len(entry.payload) > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += len(entry.payload)
    if batch:
        yield batch


def verdict(status: int) -> Verdict:
    if 200 <= status < 300:
        return Verdict.ACK
    if status in (401, 403, 408, 429) or not 400 <= status < 500:
        return Verdict.RETRY
    return Verdict.REJECT


def error_detail(body: bytes) -> Any:
    """The receiver's error JSON, or its text when it is not JSON."""
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")[:2000]


def _retry_reason(result: PostResult) -> str:
    if result.status is None:
        return result.error or "no answer"
    if result.status in (401, 403):
        return f"HTTP {result.status}: the receiver refused the API key"
    return f"HTTP {result.status}"


def interpret_single(entry: Entry, result: PostResult) -> Outcome:
    if result.status is None:
        return Outcome(retry=[entry], reason=_retry_reason(result))
    match verdict(result.status):
        case Verdict.ACK:
            return Outcome(acked=[entry])
        case Verdict.REJECT:
            return Outcome(rejected=[(entry, result.status, error_detail(result.body))])
        case _:
            return Outcome(
                retry=[entry], retry_after_s=result.retry_after_s, reason=_retry_reason(result)
            )


def interpret_batch(entries: Sequence[Entry], result: PostResult) -> Outcome:
    if result.status is None:
        return Outcome(retry=list(entries), reason=_retry_reason(result))
    kind = verdict(result.status)
    if kind is Verdict.REJECT:
        return Outcome(fallback_single=True, reason=f"batch refused with HTTP {result.status}")
    if kind is Verdict.RETRY:
        return Outcome(
            retry=list(entries), retry_after_s=result.retry_after_s, reason=_retry_reason(result)
        )
    results = _batch_results(result.body, len(entries))
    if results is None:
        return Outcome(retry=list(entries), reason="malformed batch answer")
    outcome = Outcome()
    for entry, item in zip(entries, results, strict=True):
        item_id = item.get("message_id")
        status = item.get("status")
        if (item_id is not None and item_id != entry.message_id) or not isinstance(status, int):
            outcome.retry.append(entry)
            outcome.reason = outcome.reason or "malformed batch answer"
            continue
        match verdict(status):
            case Verdict.ACK:
                outcome.acked.append(entry)
            case Verdict.REJECT:
                outcome.rejected.append((entry, status, item.get("error")))
            case _:
                outcome.retry.append(entry)
                outcome.reason = outcome.reason or f"HTTP {status} in batch"
    if outcome.retry and result.retry_after_s is not None:
        outcome.retry_after_s = result.retry_after_s
    return outcome


def _batch_results(body: bytes, expected: int) -> list[dict[str, Any]] | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list) or len(results) != expected:
        return None
    if not all(isinstance(item, dict) for item in results):
        return None
    return results
