"""`MongoStore`: the one entry point to MongoDB, on pymongo's native async API. It owns the
client, the process's `MongoGate` and the indexes, and holds the stores each query lives in,
by what they store:

- `records`: what a message's way writes (messages, pending batches, attempts, delivery
  states; msgbus/store/records.py);
- `traces`, `progress`: reads of messages, delivery states and attempts — what the API shows
  of a message, and how far each subscription's deliveries are (traces.py, progress.py);
- `config`, `producers`, `invalid`: destinations, subscriptions and the runtime knobs; the
  producer apps; the configuration documents that do not validate (config.py, producers.py,
  invalid.py);
- `figures`: push figures over time and the dashboard's reads (figures.py, pushstats.py);
- `drains`, `accepted_ids`: the retired brokers each subscription drained (drains.py), the
  receivers' claims of the message ids they publish (accepted.py).

Built from a `MongoStore` by the code that uses them (`DeliveryClaims` and `DueScan` keep
state of their caller's: its owner name, its scan floors): `DeliveryClaims` and `DueScan`
(claims.py, duescan.py), `PendingSweep` (pending.py), `ShareStore` (shares.py), `UserStore`
(users.py), `ReplayStore` (replays.py), `SchemaStore` (schemas.py), `DeletionStore`
(deletions.py). The analytics jobs' reads and writes, on pymongo's synchronous API in Spark
tasks, are in analytics.py (`AnalyticsStore`).
"""

from __future__ import annotations

from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from msgbus.errors import MongoUnavailable
from msgbus.sealing import SecretKeys
from msgbus.store.accepted import AcceptedIdStore
from msgbus.store.checked import InvalidDocumentLog
from msgbus.store.config import ConfigStore
from msgbus.store.drains import DrainStore
from msgbus.store.figures import FigureStore
from msgbus.store.gate import MongoGate
from msgbus.store.indexes import ensure_indexes
from msgbus.store.invalid import InvalidDocumentStore
from msgbus.store.producers import ProducerStore
from msgbus.store.progress import DeliveryProgress
from msgbus.store.records import RecordStore
from msgbus.store.sealed_secrets import Resealed, reseal_secrets
from msgbus.store.signin_sessions import CompanySessions
from msgbus.store.signins import SigninFailures
from msgbus.store.teams import TeamStore
from msgbus.store.traces import TraceStore


def _as_given(value: str) -> str:
    return value

class MongoStore:
    def __init__(self, uri: str, db_name: str, *, timeout_ms: int = 5000,
                 socket_timeout_ms: int = 30_000, component: str = "msgbus",
                 keys: SecretKeys | None = None, index_skip_scans: bool = True) -> None:
        """`component`: which service this process runs (its gate's metric label). `keys`
        seal the secrets it stores (msgbus/sealing.py); without, as in development tools that
        write configuration, they are stored as given, and the admin seals them at start."""
        # socket_timeout_ms: a server that stops answering (hung, or a half-open connection
        # after a restart) fails the call instead of holding its caller forever (pymongo's
        # default is no timeout); the drainers then back off and try again. Well above the
        # longest legitimate call (a sweep's update_many, a dashboard aggregation: seconds).
        # journal=True: a write is acknowledged once it is in the server's journal. The bus
        # deletes its local copy of a record or outcome on that acknowledgement, and an
        # acknowledged write that was not journaled is lost when the server crashes (up to the
        # journal's commit interval on MongoDB; every write since the last checkpoint on the
        # development stand-in). docs/decisions.md, "Journaled writes".
        self._client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            uri, serverSelectionTimeoutMS=timeout_ms, socketTimeoutMS=socket_timeout_ms,
            tz_aware=True, appname="msgbus", journal=True
        )
        # the database itself: for the stores built from this one, and for tests
        self.db = self._client[db_name]
        # every call on a message's way goes through it: an outage costs one timeout
        self.gate = MongoGate(lambda: self._client.admin.command("ping"), component=component)
        self.invalid_log = InvalidDocumentLog()  # stored documents that do not validate
        self.figures = FigureStore(self.db, self.gate)
        self.records = RecordStore(self.db, self.gate, self.figures)
        self.traces = TraceStore(self.db)
        # scans across subscriptions walk an index (MongoDB), or look at each one (the
        # development stand-in): msgbus/store/skipscan.py
        self.index_skip_scans = index_skip_scans
        self.progress = DeliveryProgress(self.db, walk=index_skip_scans)
        self.keys = keys
        seal = keys.seal if keys is not None else _as_given
        self.config = ConfigStore(self.db, self.invalid_log, seal)
        self.teams = TeamStore(self.db, self.invalid_log, seal)
        self.signins = SigninFailures(self.db)
        self.company_sessions = CompanySessions(self.db)
        self.producers = ProducerStore(self.db, self.gate, self.invalid_log)
        self.invalid = InvalidDocumentStore(self.db, self.invalid_log)
        self.drains = DrainStore(self.db)
        self.accepted_ids = AcceptedIdStore(self.db)

    async def ensure_indexes(self) -> None:
        await ensure_indexes(self.db)

    async def reseal_secrets(self, keys: SecretKeys) -> Resealed:
        """Every stored secret sealed with `keys`' newest key (msgbus/store/sealed_secrets.py)."""
        return await reseal_secrets(self.db, keys)

    async def ping(self, timeout_s: float = 1.0) -> bool:
        """Whether MongoDB answers within `timeout_s`; False at once while the gate is closed
        (health checks answer fast during an outage; the gate's probe looks for the return)."""
        try:
            async with self.gate.guard("ping", timeout_s):
                await self._client.admin.command("ping")
            return True
        except (MongoUnavailable, PyMongoError):
            return False

    async def close(self) -> None:
        await self.gate.close()
        await self.figures.close()
        await self._client.close()
