"""`RunningBus`: receiver, dispatcher, compensator and admin running in-process on port 0,
against real MongoDB-protocol, Kafka and RabbitMQ servers, plus helpers to configure them
through the admin API."""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from pydantic import SecretStr

from admin.app import create_app as admin_app
from admin.service import AdminService
from compensator.app import create_app as compensator_app
from compensator.service import CompensatorService
from dispatcher.app import create_app as dispatcher_app
from dispatcher.service import DispatcherService
from msgbus.serving import ServerGroup, make_server
from msgbus.settings import (
    AdminSettings,
    CompensatorSettings,
    ConnectionSettings,
    DispatcherSettings,
    ReceiverSettings,
)
from msgbus.store import MongoStore
from msgbus_devtools.testkit.certs import ServerTls
from msgbus_devtools.testkit.loop import BackgroundLoop
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually
from receiver.app import create_app as receiver_app
from receiver.service import ReceiverService

HOST = "127.0.0.1"


def sample_value(exposition: str, name: str, labels: dict[str, str]) -> float:
    """One sample of a Prometheus text exposition whose labels include `labels` (sums them
    when several match; 0 when none does)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


CONFIG_REFRESH_S = 0.5  # how soon the bus's services see a configuration change
# The backlog gauges read every failed delivery of a subscription (up to the cap) on each pass;
# at 0.5 s a test's thousands of due retries kept the session's MongoDB server busy.
BACKLOG_INTERVAL_S = 3.0
SHUTDOWN_TIMEOUT_S = 240.0
SLOW_SHUTDOWN_S = 30.0

USER_PASSWORD = "correct horse battery"
# uvicorn closes a connection idle for 5 s (timeout_keep_alive); a client that reuses one just
# then gets "connection reset by peer" (seen once in CI): these clients drop theirs after 2 s
CLIENT_LIMITS = httpx.Limits(keepalive_expiry=2.0)
MONGO_BUSY_RETRY_S = 30.0


class RetriesWhileMongoIsBusy(httpx.HTTPTransport):
    """The admin answers 503 `mongo_unavailable` (with Retry-After) while MongoDB does not
    answer in time, and a client tries again later. The tests' MongoDB stand-in stalls for
    seconds under the parallel pass; the tests' own calls retry as a client does, for up to
    MONGO_BUSY_RETRY_S (the tests of outages use clients of their own)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = time.monotonic() + MONGO_BUSY_RETRY_S
        while True:
            response = super().handle_request(request)
            if response.status_code != 503 or time.monotonic() > deadline:
                return response
            response.read()
            if b'"mongo_unavailable"' not in response.content:
                return response
            response.close()
            time.sleep(min(float(response.headers.get("retry-after", 1)), 2.0))


def admin_client(url: str, token: str) -> httpx.Client:
    """A client of the admin API with `token`, as the tests use it."""
    return httpx.Client(base_url=url, timeout=10, limits=CLIENT_LIMITS,
                        transport=RetriesWhileMongoIsBusy(limits=CLIENT_LIMITS),
                        headers={"authorization": f"Bearer {token}"})


class RunningBus:
    def __init__(
        self,
        loop: BackgroundLoop,
        *,
        mongo_uri: str,
        mongo_db: str,
        state_dir: Path,
        kafka_bootstrap: str = "",
        rabbitmq_url: str = "",
        compensator_options: dict[str, Any] | None = None,
        **connection_options: Any,
    ) -> None:
        self.loop = loop
        self.compensator_options = {"scan_interval_s": 0.5, **(compensator_options or {})}
        self.admin_token = "test-admin-token"
        self.connections = ConnectionSettings(
            mongo_uri=mongo_uri,
            mongo_db=mongo_db,
            kafka_bootstrap=kafka_bootstrap,
            rabbitmq_url=rabbitmq_url,
            internal_token=SecretStr("test-internal-token"),
            state_dir=state_dir,
            config_refresh_s=CONFIG_REFRESH_S,
            **connection_options,
        )
        self._group = ServerGroup()
        self._subscribers = ServerGroup()
        self.store = MongoStore(mongo_uri, mongo_db)
        self.receiver_url = self.dispatcher_url = self.admin_url = self.compensator_url = ""

    def start(self) -> RunningBus:
        self.loop.run(self._start())
        self.admin = admin_client(self.admin_url, self.admin_token)
        # The tests read every destination's messages as the bootstrap admin, which only an
        # admin who broke the glass may (admin/message_access.py); tests/integration/
        # test_teams.py reads them as teams do.
        self.admin.post("/v1/break-glass", json={
            "reason": "the test suite reads every message", "minutes": 60}).raise_for_status()
        return self

    async def _start(self) -> None:
        conn = self.connections
        self.dispatcher_service = DispatcherService(
            DispatcherSettings(port=0,
                               backlog_interval_s=BACKLOG_INTERVAL_S, cleanup_interval_s=0.5,
                               drain_settle_s=2.0, drain_check_interval_s=0.5,
                               connections=conn))
        dispatcher = await self._group.start(
            make_server(
                dispatcher_app(self.dispatcher_service),
                HOST,
                0,
            ),
            "dispatcher",
        )
        self.dispatcher_url = f"http://{HOST}:{dispatcher.port}"
        # port 0: the services learn where their /health is (the admin's /v1/services) here
        self.dispatcher_service.shares.health_url = f"{self.dispatcher_url}/health"
        self.receiver_service = ReceiverService(
            ReceiverSettings(port=0, dispatcher_url=self.dispatcher_url, connections=conn,
                             flusher="inline"))  # in-process, so tests read its metrics
        receiver = await self._group.start(
            make_server(receiver_app(self.receiver_service), HOST, 0), "receiver")
        self.receiver_url = f"http://{HOST}:{receiver.port}"
        self.receiver_service.beacon.health_url = f"{self.receiver_url}/health"
        self.compensator_service = self.new_compensator()
        compensator = await self._group.start(
            make_server(compensator_app(self.compensator_service), HOST, 0), "compensator")
        self.compensator_url = f"http://{HOST}:{compensator.port}"
        self.compensator_service.shares.health_url = f"{self.compensator_url}/health"
        admin = await self._group.start(
            make_server(
                admin_app(
                    AdminService(
                        AdminSettings(port=0, token=SecretStr(self.admin_token), connections=conn)
                    )
                ),
                HOST,
                0,
            ),
            "admin",
        )
        self.admin_url = f"http://{HOST}:{admin.port}"

    def new_compensator(self, **options: Any) -> CompensatorService:
        """A compensator of this bus (not started), with the bus's compensator options and
        `options` on top."""
        return CompensatorService(CompensatorSettings(
            port=0, connections=self.connections, **{**self.compensator_options, **options}))

    def start_admin(self, port: int = 0, **settings: Any) -> str:
        """Another admin service of this bus, with `settings` (e.g. session_ttl_s), on `port`
        (0: any free one); its URL."""

        async def start() -> int:
            service = AdminService(AdminSettings(
                port=port, token=SecretStr(self.admin_token), connections=self.connections,
                **settings))
            server = await self._group.start(make_server(admin_app(service), HOST, port),
                                             "admin")
            return server.port

        return f"http://{HOST}:{self.loop.run(start())}"

    def serve_subscriber(self, app: Any, tls: ServerTls | None = None) -> str:
        """Run a subscriber app; returns its URL (https with `tls`)."""

        async def start() -> int:
            server = make_server(app, HOST, 0) if tls is None else tls.server(app, HOST)
            return (await self._subscribers.start(server, "subscriber")).port

        return f"{'http' if tls is None else 'https'}://{HOST}:{self.loop.run(start())}/hook"

    def add_user(self, role: str, password: str = USER_PASSWORD) -> str:
        """A new user (name: `role` and a random suffix) of bus-wide `role`."""
        name = f"{role}-{uuid.uuid4().hex[:6]}"
        self.admin.put(f"/v1/users/{name}", json={"password": password, "role": role}
                       ).raise_for_status()
        return name

    def join_team(self, team: str, user: str, role: str = "viewer") -> None:
        """`user` becomes a member of `team` (made if there is none)."""
        if self.admin.get(f"/v1/teams/{team}").status_code == 404:
            self.admin.put(f"/v1/teams/{team}", json={}).raise_for_status()
        self.admin.put(f"/v1/teams/{team}/members/{user}", json={"role": role}
                       ).raise_for_status()

    def client_of(self, name: str, password: str = USER_PASSWORD,
                  token_role: str | None = None) -> httpx.Client:
        """An admin API client with an API token of user `name` (made in a session of theirs;
        `token_role`: a role below the user's)."""
        with httpx.Client(base_url=self.admin_url, timeout=10) as session:
            login = session.post("/v1/session", json={"username": name, "password": password})
            login.raise_for_status()
            made = session.post("/v1/tokens", headers={"x-csrf-token": login.json()["csrf_token"]},
                                json={"name": "tests", **({"role": token_role} if token_role
                                                          else {})})
            made.raise_for_status()
        return admin_client(self.admin_url, made.json()["token"])

    def create_destination(self, code: str, broker: str, **options: Any) -> None:
        """Create or change a destination (changing `broker` switches it at runtime)."""
        self.admin.put(f"/v1/destinations/{code}",
                       json={"broker": broker, **options}).raise_for_status()

    def receiver_metric(self, name: str, **labels: str) -> float:
        """The value of one sample on the receiver's /metrics (0 when absent)."""
        text = httpx.get(f"{self.receiver_url}/metrics", timeout=10).text
        return sample_value(text, name, labels)

    def subscribe(self, destination: str, name: str, url: str, **options: Any) -> dict[str, Any]:
        response = self.admin.put(
            f"/v1/destinations/{destination}/subscriptions/{name}", json={"url": url, **options}
        )
        response.raise_for_status()
        return dict(response.json())

    def subscribe_recorder(self, destination: str, name: str,
                           **options: Any) -> RecordingSubscriber:
        """A `RecordingSubscriber`, served and subscribed to `destination` as `name` (with the
        subscription's `options`); unless paused, returned once the dispatcher runs its
        worker."""
        subscriber = RecordingSubscriber()
        self.subscribe(destination, name, self.serve_subscriber(subscriber), **options)
        if not options.get("paused"):
            self.wait_for_workers([f"{destination}/{name}"])
        return subscriber

    def create_app(self, name: str, destinations: list[str] | None = None,
                   team: str | None = None) -> str:
        """A producer app (of `team`; default: the bootstrap admin's, platform) and its key."""
        response = self.admin.post("/v1/apps", json={
            "name": name, "destinations": destinations or ["*"],
            **({} if team is None else {"team": team})})
        response.raise_for_status()
        return str(response.json()["api_key"])

    def deliveries(self, message_id: str) -> list[dict[str, Any]]:
        """The message's deliveries as the admin's timeline shows them; none while its record
        is not in MongoDB yet (the receiver writes it in batches, after the 202)."""
        answer = self.admin.get(f"/v1/messages/{message_id}")
        if answer.status_code == 404:
            return []
        answer.raise_for_status()
        return list(answer.json()["deliveries"])

    def documents_holding(self, values: set[str]) -> list[str]:
        """Where in the bus's database any of `values` is stored plain (collection/_id)."""
        async def scan() -> list[str]:
            found = []
            for name in await self.store.db.list_collection_names():
                async for doc in self.store.db[name].find({}):
                    text = orjson.dumps(doc, default=str).decode()
                    if any(value in text for value in values):
                        found.append(f"{name}/{doc['_id']}")
            return found
        found: list[str] = self.query(scan())
        return found

    def wait_for_workers(self, sub_ids: list[str], timeout_s: float = 30) -> None:
        def ready() -> bool:
            health = httpx.get(f"{self.dispatcher_url}/health", timeout=5).json()
            return set(sub_ids) <= set(health["subscriptions"])

        eventually(ready, timeout_s, f"dispatcher workers for {sub_ids}")

    def wait_for_config(self, timeout_s: float = 30) -> None:
        """Until every service has read the configuration written before this call and acted
        on it (queues declared, workers started or stopped, rates applied)."""
        since = time.monotonic()
        registries = [self.receiver_service.registry, self.dispatcher_service.registry,
                      self.compensator_service.registry]
        eventually(lambda: all(r.current_as_of > since for r in registries), timeout_s,
                   "every service to re-read the configuration")

    def query(self, coro: Any) -> Any:
        """Run a store coroutine (e.g. `bus.store.progress.count_deliveries(...)`) in the bus
        loop."""
        return self.loop.run(coro)

    def close(self) -> None:
        """Stops the subscribers, then the services. A session's bus serves dozens of
        subscriptions by the end of the suite, and stopping their consumers has, at times, taken
        over a minute on the shared 2-core machine: the wait is long, and a slow stop is said."""
        self.admin.close()
        began = time.monotonic()
        self.loop.run(self._subscribers.stop(together=True), timeout_s=SHUTDOWN_TIMEOUT_S)
        self.loop.run(self._group.stop(), timeout_s=SHUTDOWN_TIMEOUT_S)
        self.loop.run(self.store.close())
        took_s = time.monotonic() - began
        if took_s > SLOW_SHUTDOWN_S:
            print(f"[bus] stopping the bus of {self.store.db.name} took {took_s:.0f} s",
                  file=sys.stderr)


@contextlib.contextmanager
def running_bus(mongo_uri: str, state_dir: Path, db_prefix: str,
                **options: Any) -> Iterator[RunningBus]:
    """A started bus with a database of its own (`db_prefix` + random), on its own loop;
    closed after. `options` go to RunningBus (brokers, compensator options...)."""
    loop = BackgroundLoop()
    running = RunningBus(loop, mongo_uri=mongo_uri,
                         mongo_db=f"{db_prefix}_{uuid.uuid4().hex[:8]}", state_dir=state_dir,
                         **options).start()
    try:
        yield running
    finally:
        running.close()
        loop.close()


StartBus = Callable[..., contextlib.AbstractContextManager[RunningBus]]
"""`start(name, **options)` -> a `running_bus` on servers already chosen (the integration tests'
`start_bus` fixture): `with start_bus("ui") as bus:`."""
