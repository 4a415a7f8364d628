"""The indexes of the bus's collections, each there for a query of the store (`MongoStore`
creates them at start)."""

from __future__ import annotations

from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

from msgbus.store import pushstats, signin_sessions, signins

# the compensator's claims and its scan for subscriptions with something due (store/claims.py)
CLAIMS_INDEX = [("subscription", ASCENDING), ("status", ASCENDING), ("next_attempt_at", ASCENDING)]
# one subscription's deliveries in a status by age: counts, the sweep of old pending states
STATES_BY_AGE_INDEX = [("subscription", ASCENDING), ("status", ASCENDING),
                       ("created_at", ASCENDING)]
# the sweep: one subscription's pending batches, oldest first
PENDING_BATCHES_INDEX = [("subscription", ASCENDING), ("recorded_at", ASCENDING)]

INDEXES: dict[str, list[IndexModel]] = {
    "messages": [
        IndexModel([("biz_id", ASCENDING), ("created_at", DESCENDING)]),
        IndexModel([("destination", ASCENDING), ("created_at", DESCENDING)]),
        IndexModel([("created_at", DESCENDING)]),
    ],
    "deliveries": [
        # a message's trace: an equality on message_id (docs/decisions.md: why not a range
        # of the _ids, which begin with the message id)
        IndexModel([("message_id", ASCENDING)]),
        IndexModel(STATES_BY_AGE_INDEX),
        IndexModel(CLAIMS_INDEX),
        # analytics: reads by time range (statistics, archive), split into parallel slices
        IndexModel([("created_at", ASCENDING)]),
    ],
    "pending_batches": [IndexModel(PENDING_BATCHES_INDEX)],
    "attempts": [
        IndexModel([("message_id", ASCENDING), ("started_at", ASCENDING)]),
        IndexModel([("started_at", ASCENDING)]),  # analytics: reads by time range
        # the admin dashboard's push latency and success rate of one subscription's last hour
        IndexModel([("subscription", ASCENDING), ("started_at", DESCENDING)]),
    ],
    "subscriptions": [IndexModel([("destination", ASCENDING)])],
    # the pending request of a subscription (one at a time), and the newest requests
    "subscription_requests": [
        IndexModel([("destination", ASCENDING), ("name", ASCENDING), ("state", ASCENDING)]),
        IndexModel([("requested_at", DESCENDING)])],
    "schemas": [IndexModel([("destination", ASCENDING), ("version", ASCENDING)])],
    "apps": [IndexModel([("key_hashes", ASCENDING)])],
    "teams": [IndexModel([("members.user", ASCENDING)])],  # a user's teams, at each sign-in
    "notifications": [IndexModel([("team", ASCENDING), ("at", DESCENDING)])],  # a team's recent
    "instances": [IndexModel([("expires_at", ASCENDING)])],  # the live ones (cap shares)
    "push_stats": pushstats.INDEXES,
    "signin_failures": signins.INDEXES,
    "oidc_sessions": signin_sessions.INDEXES,
}
# Indexes earlier versions created that no query uses any more: dropped by `ensure_indexes`,
# since every index costs a write per document written to its collection (docs/decisions.md).
OBSOLETE_INDEXES: dict[str, list[str]] = {"deliveries": ["status_1_next_attempt_at_1"]}


async def ensure_indexes(db: AsyncDatabase[dict[str, Any]]) -> None:
    # obsolete ones first: MongoDB refuses a second index on the same keys
    for collection, names in OBSOLETE_INDEXES.items():
        existing = await db[collection].index_information()
        for name in names:
            if name in existing:
                await db[collection].drop_index(name)
    for collection, indexes in INDEXES.items():
        await db[collection].create_indexes(indexes)
