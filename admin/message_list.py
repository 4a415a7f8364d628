"""The message list of the UI and the API: messages newest first, each with its delivery state
per subscription, filtered by destination, subscription, state, biz_id and time range, in pages
that cost the same on the first page and a million messages back.

Pages are keysets, never skips or counts: a page is the `limit` messages just beyond a cursor,
the (created_at, message id) of the last one shown, in the order of an index that ends on
created_at. Messages arriving meanwhile never shift a page: the next and previous pages of a
cursor are what they were. Ties of created_at (milliseconds) are ordered by message id: a
page's last timestamp is read whole (an equality on the index), so no tie is cut in two.

Where the rows come from:
- no state asked for: the messages, on the (biz_id | destination, created_at) index;
- a state: the deliveries of each subscription asked for (one, a destination's, or all), on the
  (subscription, status, created_at) index, merged; `pending` has no delivery document, so it
  reads the subscriptions' pending batches (the newest `PENDING_SCAN` ids);
- a state and a biz_id: the biz_id's messages, their states checked, at most `SCAN_CAP`
  messages a request (a page may then be short; its cursor goes on where the scan stopped).

SecantusDB's index scans do not stop at a limit (docs/decisions.md), so a range is read in
widening windows back from the cursor (1 h, 1 d, 7 d, 31 d, all) while it has less than a page.
On MongoDB one query per source would do; the windows cost a few more queries there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from msgbus.errors import InvalidInput
from msgbus.models import DeliveryStatus, delivery_id, utcnow
from msgbus.store import MongoStore
from msgbus.store.traces import Key

WINDOWS: tuple[timedelta | None, ...] = (
    timedelta(hours=1), timedelta(days=1), timedelta(days=7), timedelta(days=31), None)
SCAN_CAP = 2000
PENDING_SCAN = 1000


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ends: `older` pages go on past it, the others come back before it."""

    created_at: datetime
    message_id: str

    def encode(self) -> str:
        return f"{self.created_at.isoformat()}|{self.message_id}"

    @classmethod
    def decode(cls, text: str, field: str) -> Cursor:
        when, _, message_id = text.partition("|")  # a time alone: what is older than it
        try:
            created_at = datetime.fromisoformat(when)
        except ValueError:
            created_at = None
        if created_at is None:
            raise InvalidInput(f"{field}: not a cursor of this list ({text[:80]!r})", field=field)
        return cls(created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC),
                   message_id)


@dataclass(frozen=True, slots=True)
class ListQuery:
    biz_id: str | None = None
    destination: str | None = None
    subscription: str | None = None
    state: DeliveryStatus | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Source:
    """One index-backed range of rows: those matching `match` of what `read_keys` reads (the
    messages, or one subscription's delivery states)."""

    read_keys: Callable[[Mapping[str, Any], bool, int | None], Awaitable[list[Key]]]
    match: dict[str, Any]


@dataclass(slots=True)
class Page:
    messages: list[dict[str, Any]]  # newest first, each with `deliveries` (its states)
    newer: Cursor | None  # the cursor of the previous (newer) page, if there is one
    older: Cursor | None  # that of the next (older) page
    scanned_out: bool = False  # a state + biz_id scan stopped at SCAN_CAP


def _beyond(key: Key, cursor: Cursor | None, older: bool) -> bool:
    if cursor is None:
        return True
    mark = (cursor.created_at, cursor.message_id)
    return key < mark if older else key > mark


async def source_keys(source: Source, query: ListQuery, cursor: Cursor | None, older: bool,
                      limit: int) -> list[Key]:
    """Up to `limit` keys of `source` beyond `cursor`, within the query's time range, in the
    page's direction (newest first when `older`)."""
    keys: list[Key] = []
    if cursor is not None:  # the cursor's own millisecond: its ties beyond it
        ties = await source.read_keys(source.match | {"created_at": cursor.created_at},
                                      False, None)
        keys += [k for k in ties if _beyond(k, cursor, older)]
    found = await _window_keys(source, query, cursor, older, limit)
    if len(found) >= limit:  # the page's last millisecond, read whole
        edge = found[-1][0]
        found += await source.read_keys(source.match | {"created_at": edge}, False, None)
    keys = sorted(set(keys + found), reverse=older)
    return [k for k in keys if _in_range(k, query)][:limit]


def _in_range(key: Key, query: ListQuery) -> bool:
    return ((query.since is None or key[0] >= query.since)
            and (query.until is None or key[0] < query.until))


async def _window_keys(source: Source, query: ListQuery, cursor: Cursor | None, older: bool,
                       limit: int) -> list[Key]:
    """Keys strictly past the cursor's millisecond, read in widening windows."""
    start = cursor.created_at if cursor is not None else None
    bound = query.since if older else query.until
    if older:
        start = min(filter(None, [start, query.until]), default=None)
    else:
        start = max(filter(None, [start, query.since]), default=None)
    found: list[Key] = []
    for window in WINDOWS:
        edge = _window_edge(start, window, older, bound)
        condition: dict[str, datetime] = {}
        if start is not None:
            condition["$lt" if older else "$gt"] = start
        if edge is not None:
            condition["$gte" if older else "$lte"] = edge
        match = source.match | ({"created_at": condition} if condition else {})
        found = await source.read_keys(match, older, limit)
        if len(found) >= limit or edge == bound:
            break
    return found


def _window_edge(start: datetime | None, window: timedelta | None, older: bool,
                 bound: datetime | None) -> datetime | None:
    """Where a window from `start` ends, never past `bound` (the query's time range)."""
    if window is None:
        return bound
    origin = start or utcnow()
    edge = origin - window if older else origin + window
    if bound is not None and (edge < bound if older else edge > bound):
        return bound
    return edge


async def sources_of(store: MongoStore, query: ListQuery) -> list[Source]:
    """Where the rows of `query` come from (the module's docstring); [] for pending."""
    if query.state is None or query.biz_id is not None:
        match: dict[str, Any] = {}
        if query.biz_id is not None:
            match["biz_id"] = query.biz_id
        if query.destination is not None:
            match["destination"] = query.destination
        if query.subscription is not None:
            match["destination"] = query.subscription.split("/", 1)[0]
            match["subscriptions"] = query.subscription
        return [Source(store.traces.message_keys, match)]
    if query.state == DeliveryStatus.PENDING:
        return []
    return [Source(store.traces.state_keys, {"subscription": sub_id, "status": query.state.value})
            for sub_id in await subscription_ids(store, query)]


async def subscription_ids(store: MongoStore, query: ListQuery) -> list[str]:
    if query.subscription is not None:
        return [query.subscription]
    return [s.id for s in await store.config.list_subscriptions(query.destination)]


async def pending_keys(store: MongoStore, query: ListQuery, cursor: Cursor | None,
                       older: bool, limit: int) -> list[Key]:
    """Pending messages (no outcome yet) of the subscriptions asked for, among the newest
    `PENDING_SCAN` of each one's pending batches."""
    keys: set[Key] = set()
    for sub_id in await subscription_ids(store, query):
        ids = await store.progress.pending_message_ids(sub_id, PENDING_SCAN)
        found = await store.traces.messages_by_ids(ids, {"created_at": 1})
        keys.update((m["created_at"], str(m["_id"])) for m in found)
    return sorted((k for k in keys if _beyond(k, cursor, older) and _in_range(k, query)),
                  reverse=older)[:limit]


async def states_of(store: MongoStore, messages: Sequence[dict[str, Any]]
                    ) -> dict[str, list[dict[str, Any]]]:
    """Each message's delivery states, one per subscription it was recorded for (pending when
    it has no outcome yet), by message id: by `_id`, a chunk of ids per query."""
    wanted = [delivery_id(m["_id"], sub) for m in messages for sub in m.get("subscriptions") or []]
    found = {d["_id"]: d for d in await store.traces.listed_states(wanted)}
    states: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        row = states.setdefault(m["_id"], [])
        for sub in m.get("subscriptions") or []:
            state = found.get(delivery_id(m["_id"], sub))
            if state is None:
                state = {"subscription": sub, "status": DeliveryStatus.PENDING.value,
                         "attempts": 0}
            row.append({k: v for k, v in state.items() if k not in ("_id", "message_id")})
    return states


async def _scan_states(store: MongoStore, source: Source, query: ListQuery,
                       cursor: Cursor | None, older: bool, limit: int
                       ) -> tuple[list[Key], Key | None]:
    """The keys of the source's messages in the query's state, at most `SCAN_CAP` messages
    looked at; and the key where the scan stopped, when it stopped before the end."""
    matched: list[Key] = []
    at, scanned, chunk = cursor, 0, 200
    while len(matched) < limit:
        if scanned >= SCAN_CAP:
            return matched, (at.created_at, at.message_id) if at is not None else None
        keys = await source_keys(source, query, at, older, chunk)
        scanned += len(keys)
        docs = await store.traces.messages_by_ids([k[1] for k in keys], {"subscriptions": 1})
        states = await states_of(store, docs)
        matched += [k for k in keys if _in_state(states.get(k[1], []), query)]
        if len(keys) < chunk:
            break
        at = Cursor(*keys[-1])
    return matched[:limit], None


def _in_state(states: list[dict[str, Any]], query: ListQuery) -> bool:
    assert query.state is not None
    return any(s["status"] == query.state.value
               and (query.subscription is None or s["subscription"] == query.subscription)
               for s in states)


async def _page_keys(store: MongoStore, query: ListQuery, cursor: Cursor | None, older: bool,
                     limit: int) -> tuple[list[Key], Key | None]:
    if query.state == DeliveryStatus.PENDING and query.biz_id is None:
        return await pending_keys(store, query, cursor, older, limit), None
    sources = await sources_of(store, query)
    if query.state is not None and query.biz_id is not None:  # the biz_id's messages, checked
        return await _scan_states(store, sources[0], query, cursor, older, limit)
    merged: set[Key] = set()
    for source in sources:
        merged.update(await source_keys(source, query, cursor, older, limit))
    return sorted(merged, reverse=older)[:limit], None


async def list_page(store: MongoStore, query: ListQuery, cursor: Cursor | None = None, *,
                    older: bool = True, limit: int = 50) -> Page:
    """The page of `query` just past `cursor` (older) or just before it (newer)."""
    keys, stop = await _page_keys(store, query, cursor, older, limit + 1)
    more = len(keys) > limit or stop is not None
    keys = keys[:limit]
    ends = [*keys, *([stop] if stop is not None and len(keys) < limit else [])]
    # where the next page in this direction starts, and the one the other way
    far = Cursor(*ends[-1]) if more and ends else None
    near = Cursor(*keys[0]) if cursor is not None and keys else cursor
    if not older:
        keys.reverse()
    docs = {d["_id"]: d for d in await store.traces.messages_by_ids([k[1] for k in keys],
                                                                  {"body": 0, "headers": 0})}
    messages = [docs[k[1]] for k in keys if k[1] in docs]
    states = await states_of(store, messages)
    for message in messages:
        message["deliveries"] = states.get(message["_id"], [])
    if older:
        return Page(messages, newer=near, older=far, scanned_out=stop is not None)
    return Page(messages, newer=far, older=near, scanned_out=stop is not None)
