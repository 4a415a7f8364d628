"""A bus deployed as separate OS processes for resilience tests.

`start_servers()` starts private backing servers that a test may stop and restart: SecantusDB
(MongoDB protocol), tansu (Kafka protocol) on S3 storage served by moto (so a broker restart
loses nothing), and a RabbitMQ node. `Deployment` is one test's bus on them: its own MongoDB
database with destinations, subscriptions and a producer app written through `MongoStore`, a
`RecordingSubscriber` per subscription, a dispatcher process, receiver processes and a
compensator process.
Clients reach tansu through a `TcpGate` (tansu advertises the gate's address): see
`Servers.stop_kafka` for why. A deployment made with `mongo_through_gate` reaches MongoDB through
another (`Servers.mongo_gate`), which a test freezes to cut MongoDB off as a network that drops
packets would.
`check_everything_delivered()` waits until every message a load got a 202 for is recorded in
MongoDB, pushed to its subscribers and marked delivered, and prints what that took.
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import HttpUrl

from msgbus.auth import hash_api_key, new_api_key
from msgbus.models import BrokerKind, DeliveryStatus, Destination, Subscription
from msgbus.processes import stop_children
from msgbus.serving import ServerGroup, make_server
from msgbus.store import MongoStore
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.load import SteadyLoad
from msgbus_devtools.testkit.loop import BackgroundLoop
from msgbus_devtools.testkit.procs import BusProcess, RabbitNode, ServerSlot, say
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.tcp_gate import TcpGate, mongo_uri_through
from msgbus_devtools.testkit.waiting import eventually

T = TypeVar("T")
KAFKA_BUCKET = "tansu"
SUBSCRIPTION = "rec"  # the first subscription of every destination
PROGRESS_EVERY_S = 5.0
METRIC_LINES = 400  # of each process, printed when a test fails (1,000 subscriptions make 30,000)
IDLE_PER_DESTINATION = 10  # subscriptions per idle destination (`Deployment.idle_subscriptions`)
KAFKA_QUIESCE_S = 1.0  # tansu finishes the produce requests it is working on well within this


# ---- backing servers -----------------------------------------------------------------------------


@dataclass
class Servers:
    mongo: ServerSlot
    moto: ServerSlot
    kafka: ServerSlot
    kafka_gate: TcpGate
    rabbit: RabbitNode
    mongo_gate: TcpGate

    def all(self) -> list[ServerSlot | RabbitNode]:
        return [self.rabbit, self.kafka, self.moto, self.mongo]

    def stop_kafka(self) -> float:
        """A Kafka outage: cut every client off (the gate resets their connections), let tansu
        finish what it was storing, then stop it.

        Why not just stop tansu under load: tansu 0.6.0 (S3 storage) loses records that are
        being produced when it stops (SIGTERM or SIGKILL) and, after its restart, acknowledges
        the idempotent producer's retry of them without storing them: acked, yet gone. Real
        Kafka never acks a batch it does not hold. (Reproduced without msgbus: an idempotent
        confluent-kafka producer at ~400 msg/s loses 1-8 acked records in about half of the
        restarts; none with the gate first, none without idempotence.)"""
        began = time.monotonic()
        self.kafka_gate.close()
        time.sleep(KAFKA_QUIESCE_S)
        self.kafka.stop()
        return time.monotonic() - began

    def start_kafka(self) -> float:
        began = time.monotonic()
        self.kafka.start()
        self.kafka_gate.open()
        return time.monotonic() - began

    def restart_stopped(self) -> None:
        """Bring back whatever a failed test left stopped or paused (the next test needs it)."""
        for server in (self.mongo, self.moto, self.kafka, self.rabbit):
            server.resume()
            if not server.up:
                server.start()
        self.kafka_gate.open()
        self.mongo_gate.thaw()
        self.mongo_gate.open()

    def close(self) -> None:
        """Every server killed: nothing is kept, and graceful stops take seconds each."""
        for server in self.all():
            with contextlib.suppress(Exception):
                server.kill9()
        self.kafka_gate.stop()
        self.mongo_gate.stop()


def start_servers(base_dir: Path) -> Servers:
    """Start the private servers (RabbitMQ boots while the others start)."""
    began = time.monotonic()
    rabbit = RabbitNode(base_dir / "rabbitmq")
    rabbit.launch()
    started: list[ServerSlot | RabbitNode] = [rabbit]
    kafka_gate: TcpGate | None = None
    try:
        moto = ServerSlot(services.start_moto(services.free_port(), base_dir))
        started.append(moto)
        services.create_s3_bucket(moto.url, KAFKA_BUCKET)
        kafka_gate = TcpGate(services.HOST, services.free_port()).start()
        kafka = ServerSlot(services.start_tansu(
            kafka_gate.target[1], base_dir, storage_engine=f"s3://{KAFKA_BUCKET}/",
            env=services.s3_env(moto.url), advertised_port=kafka_gate.port))
        started.append(kafka)
        mongo = ServerSlot(services.start_secantus(services.free_port(), base_dir / "mongo",
                                                   base_dir))
        started.append(mongo)
        mongo_gate = TcpGate(services.HOST, mongo.running.port).start()
        rabbit.wait_ready()
    except BaseException:
        for server in reversed(started):
            with contextlib.suppress(Exception):
                server.close()
        if kafka_gate is not None:
            kafka_gate.stop()
        raise
    say(f"private servers up in {time.monotonic() - began:.1f} s: MongoDB {mongo.url}, "
        f"tansu {kafka.url} (through a gate; s3 on {moto.url}), RabbitMQ {rabbit.url}")
    return Servers(mongo=mongo, moto=moto, kafka=kafka, kafka_gate=kafka_gate, rabbit=rabbit,
                   mongo_gate=mongo_gate)


# ---- timing --------------------------------------------------------------------------------------


@dataclass
class Phases:
    """Names and durations of a test's phases, printed as they end and together at the end."""

    began: float = field(default_factory=time.monotonic)
    done: list[tuple[str, float]] = field(default_factory=list)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        say(f"> {name}")
        try:
            yield
        finally:
            took = time.monotonic() - start
            self.done.append((name, took))
            say(f"< {name}: {took:.1f} s")

    def report(self) -> str:
        rows = [f"  {took:7.1f} s  {name}" for name, took in self.done]
        total = time.monotonic() - self.began
        return "phases:\n" + "\n".join(rows) + f"\n  {total:7.1f} s  in all"


def wait_with_progress(what: str, have_need: Callable[[], tuple[int, int]],
                       timeout_s: float) -> None:
    """`eventually` have >= need, with "have of need" printed every few seconds and in the
    timeout error."""
    last = (0, 0)

    def reached() -> bool:
        nonlocal last
        last = have_need()
        return last[0] >= last[1]

    eventually(reached, timeout_s, what, interval_s=0.5,
               progress=lambda: f"{last[0]} of {last[1]}")


# ---- one test's bus ------------------------------------------------------------------------------


class Deployment:
    def __init__(self, servers: Servers, work_dir: Path, destinations: dict[str, BrokerKind],
                 subscription_names: tuple[str, ...] = (SUBSCRIPTION,), *,
                 mongo_through_gate: bool = False) -> None:
        """Every destination gets one subscription per name (the first must be
        SUBSCRIPTION), each with a subscriber of its own. With `mongo_through_gate` the bus's
        processes reach MongoDB through `servers.mongo_gate` (the test's own reads do not)."""
        if subscription_names[:1] != (SUBSCRIPTION,):
            raise ValueError(f"the first subscription is named {SUBSCRIPTION!r}")
        self.servers = servers
        self.work_dir = work_dir
        self.destinations = destinations
        self.subscription_names = subscription_names
        self.db = f"resilience_{uuid.uuid4().hex[:10]}"
        self.mongo_url = servers.mongo.url
        if mongo_through_gate:
            self.mongo_url = mongo_uri_through(servers.mongo_gate)
        self.token = secrets.token_urlsafe(24)
        self.loop = BackgroundLoop()
        self.store = MongoStore(servers.mongo.url, self.db)
        self._subscriber_servers = ServerGroup()
        # the subscriber of each destination's first subscription, by destination code
        self.subscribers: dict[str, RecordingSubscriber] = {}
        # the subscriber of every subscription, by subscription id ("code/name")
        self.subscriber_of: dict[str, RecordingSubscriber] = {}
        self.processes: list[BusProcess] = []
        self.dispatcher: BusProcess | None = None
        self.receivers: list[BusProcess] = []
        self.api_key = ""
        self.subscription_options: dict[str, Any] = {}  # fields of every subscription
        # more fields of the subscriptions of one destination, by its code
        self.options_of: dict[str, dict[str, Any]] = {}
        self.extra_env: dict[str, str] = {}  # more MSGBUS_* variables of every process
        # MSGBUS_COMPENSATOR_* of the compensator `start()` runs
        self.compensator_settings: dict[str, str] = {"scan_interval_s": "0.5"}
        self.subscriber_factory: Callable[[], RecordingSubscriber] = RecordingSubscriber
        # one subscriber (one server) for every subscription, when set: for many of them
        self.shared_subscriber: RecordingSubscriber | None = None
        self._shared_url = ""
        # this many idle subscriptions beside the destinations': RabbitMQ destinations of
        # IDLE_PER_DESTINATION subscriptions each, all pushing to `idle_subscriber`; the load
        # sends them nothing
        self.idle_subscriptions = 0
        self.idle_subscriber = RecordingSubscriber()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        return self.loop.run(coro, timeout_s)

    # -- set-up --------------------------------------------------------------------------

    def start(self, receivers: int = 1, workers_within_s: float = 60) -> None:
        self.run(self._configure(), timeout_s=max(60, workers_within_s))
        self.dispatcher = self._process("dispatcher", "dispatcher", self.work_dir / "dispatcher")
        # The receivers first: they create each destination's topic and queues as they load
        # the registry. A Kafka consumer that subscribes before its topic exists finds it only
        # at its next metadata refresh, up to 10 s later (msgbus/brokers/_kafka_consumer.py).
        for index in range(receivers):
            self.add_receiver(f"receiver-{index}").start()
        # the bus's safety net, as in production: a push that failed is retried (after the
        # subscription's first retry delay, 10 s by default); it starts beside the dispatcher
        self.compensator = self.add_compensator("compensator", **self.compensator_settings)
        self.dispatcher.launch()
        self.compensator.launch()
        self.dispatcher.wait_started()
        self.compensator.wait_started()
        subscriptions = set(self.subscription_ids())
        eventually(lambda: subscriptions <= self._dispatcher_workers(), workers_within_s,
                   f"dispatcher workers for {len(subscriptions)} subscriptions", interval_s=0.2,
                   progress=lambda: f"{len(subscriptions & self._dispatcher_workers())} up")

    async def _configure(self) -> None:
        await self.store.ensure_indexes()
        for code, broker in self.destinations.items():
            await self.store.config.save_destination(Destination(code=code, broker=broker))
            for name in self.subscription_names:
                subscriber, url = await self._subscriber_for(f"{code}-{name}")
                await self.store.config.save_subscription(Subscription(
                    destination=code, name=name, url=HttpUrl(url),
                    # every dispatcher serves every subscription unless a test says otherwise:
                    # these tests are about several processes keeping one promise
                    **{"max_concurrency": 32, "dispatchers": None, **self.subscription_options,
                       **self.options_of.get(code, {})}))
                self.subscriber_of[f"{code}/{name}"] = subscriber
            self.subscribers[code] = self.subscriber_of[f"{code}/{SUBSCRIPTION}"]
        await self._configure_idle()
        self.api_key = new_api_key()
        await self.store.producers.create_app("load", hash_api_key(self.api_key), ["*"])

    async def _configure_idle(self) -> None:
        if not self.idle_subscriptions:
            return
        url = HttpUrl(await self._serve(self.idle_subscriber, "subscriber-idle"))
        for code in self.idle_destinations():
            await self.store.config.save_destination(
                Destination(code=code, broker=BrokerKind.RABBITMQ))
        for sub_id in self.idle_ids():
            code, name = sub_id.split("/", 1)
            await self.store.config.save_subscription(Subscription(
                destination=code, name=name, url=url,
                **{"dispatchers": None, **self.subscription_options}))

    async def _subscriber_for(self, name: str) -> tuple[RecordingSubscriber, str]:
        """A subscription's subscriber and its URL: a new one, or the shared one."""
        subscriber = self.shared_subscriber or self.subscriber_factory()
        if subscriber is self.shared_subscriber and self._shared_url:
            return subscriber, self._shared_url
        url = await self._serve(subscriber, f"subscriber-{name}")
        if subscriber is self.shared_subscriber:
            self._shared_url = url
        return subscriber, url

    async def _serve(self, subscriber: RecordingSubscriber, name: str) -> str:
        """Start a server for `subscriber`; returns its push URL."""
        server = await self._subscriber_servers.start(
            make_server(subscriber, services.HOST, 0), name)
        return f"http://{services.HOST}:{server.port}/hook"

    def _dispatcher_workers(self) -> set[str]:
        """The subscriptions some running dispatcher serves."""
        found: set[str] = set()
        for process in self.processes:
            if process.service == "dispatcher" and process.process is not None \
                    and process.process.poll() is None:
                health = process.health()
                found.update(health["subscriptions"] if health else ())
        return found

    def _env(self, state_dir: Path) -> dict[str, str]:
        servers = self.servers
        return {
            "MSGBUS_MONGO_URI": self.mongo_url,
            "MSGBUS_MONGO_DB": self.db,
            "MSGBUS_KAFKA_BOOTSTRAP": servers.kafka.url,
            "MSGBUS_RABBITMQ_URL": servers.rabbit.url,
            "MSGBUS_INTERNAL_TOKEN": self.token,
            "MSGBUS_STATE_DIR": str(state_dir),
            "MSGBUS_CONFIG_REFRESH_S": "0.5",
            **self.extra_env,
        }

    def _process(self, service: str, name: str, state_dir: Path) -> BusProcess:
        port = services.free_port()
        env = self._env(state_dir)
        prefix = f"MSGBUS_{service.upper()}_"
        env[f"{prefix}PORT"] = str(port)
        if service == "receiver":
            assert self.dispatcher is not None
            env[f"{prefix}DISPATCHER_URL"] = self.dispatcher.url
        else:
            env[f"{prefix}INSTANCE"] = name
        process = BusProcess(service, name, port, env, self.work_dir)
        self.processes.append(process)
        return process

    def add_dispatcher(self, name: str) -> BusProcess:
        """Another dispatcher (not started), with a state directory of its own."""
        return self._process("dispatcher", name, self.work_dir / name)

    def add_receiver(self, name: str) -> BusProcess:
        """A receiver with a state (and so buffer) directory of its own."""
        receiver = self._process("receiver", name, self.work_dir / name)
        self.receivers.append(receiver)
        return receiver

    def add_compensator(self, name: str, **settings: str) -> BusProcess:
        """A compensator with a state directory of its own; `settings` are its
        MSGBUS_COMPENSATOR_* variables (e.g. lease_s="2")."""
        compensator = self._process("compensator", name, self.work_dir / name)
        compensator.env.update({f"MSGBUS_COMPENSATOR_{key.upper()}": value
                                for key, value in settings.items()})
        return compensator

    def load(self, *, rate_per_s: float, duration_s: float | None = None,
             messages: int | None = None) -> SteadyLoad:
        return SteadyLoad([r.url for r in self.receivers], list(self.destinations),
                          self.api_key, rate_per_s=rate_per_s, duration_s=duration_s,
                          messages=messages)

    # -- observing -----------------------------------------------------------------------

    def subscription_ids(self, code: str | None = None) -> list[str]:
        """"code/name" of every subscription, the idle ones included (of destination `code`,
        if given)."""
        return [*(f"{dest}/{name}" for dest in self.destinations
                  for name in self.subscription_names if code in (None, dest)),
                *(sub_id for sub_id in self.idle_ids()
                  if code in (None, sub_id.split("/", 1)[0]))]

    def idle_destinations(self) -> list[str]:
        count = -(-self.idle_subscriptions // IDLE_PER_DESTINATION)
        return [f"idle{index}-{self.db[-6:]}" for index in range(count)]

    def idle_ids(self) -> list[str]:
        """"code/name" of the idle subscriptions (`idle_subscriptions`)."""
        ids = [f"{code}/i{index}" for code in self.idle_destinations()
               for index in range(IDLE_PER_DESTINATION)]
        return ids[:self.idle_subscriptions]

    def pushes(self, code: str) -> int:
        return len(self.subscribers[code].pushes)

    def wait_warm(self, pushes: int, timeout_s: float = 60) -> None:
        """Wait until every subscriber got `pushes` pushes: the path works end to end."""
        def pushed() -> tuple[int, int]:
            return min(len(sub.pushes) for sub in self.subscriber_of.values()), pushes

        wait_with_progress("the first pushes of every subscription", pushed, timeout_s)

    def stored_ids(self, code: str) -> set[str]:
        async def fetch() -> set[str]:
            cursor = self.store.db.messages.find({"destination": code}, {"_id": 1})
            return {str(doc["_id"]) async for doc in cursor}

        return self.run(fetch())

    def delivered_ids(self, subscription: str) -> set[str]:
        """Ids of the messages MongoDB marks delivered to `subscription` ("code/name")."""
        async def fetch() -> set[str]:
            cursor = self.store.db.deliveries.find(
                {"subscription": subscription,
                 "status": DeliveryStatus.DELIVERED.value}, {"message_id": 1})
            return {str(doc["message_id"]) async for doc in cursor}

        return self.run(fetch())

    def describe(self, message_ids: set[str], limit: int = 5) -> str:
        """Where some messages are: in MongoDB? their delivery states? pushed?"""
        lines = []
        for message_id in sorted(message_ids)[:limit]:
            async def look(mid: str = message_id) -> tuple[bool, list[Any]]:
                found = await self.store.db.messages.find_one({"_id": mid}, {"_id": 1})
                states = [(d["subscription"], d["status"], d.get("attempts"))
                          async for d in self.store.db.deliveries.find({"message_id": mid})]
                return found is not None, states

            stored, states = self.run(look())
            pushed = [sid for sid, sub in self.subscriber_of.items()
                      if message_id in sub.message_ids()]
            lines.append(f"  {message_id}: in messages={stored}, deliveries={states}, "
                         f"pushed to={pushed}")
        return "\n".join(lines)

    def logs(self, lines: int = 30) -> str:
        return "\n".join(p.tail(lines) for p in self.processes)

    @contextlib.contextmanager
    def logs_on_failure(self) -> Iterator[None]:
        """Print the end of every process's log when the block fails."""
        try:
            yield
        except BaseException:
            self.print_state()
            raise

    def print_state(self) -> None:
        """The end of every process's log, and the health and metrics of those running."""
        print("\n" + self.logs(), flush=True)
        for process in self.processes:
            if process.process is not None and process.process.poll() is None:
                say(f"{process.name} health: {json.dumps(process.health())[:3000]}")
                lines = [line for line in process.metrics("msgbus_")
                         if "_bucket{" not in line and "_created{" not in line]
                left = len(lines) - METRIC_LINES
                more = f"\n  ... {left} more" if left > 0 else ""
                say(f"{process.name} metrics:\n  " + "\n  ".join(lines[:METRIC_LINES]) + more)

    # -- checking --------------------------------------------------------------------------

    def check_everything_delivered(self, load: SteadyLoad, phases: Phases,
                                   timeout_s: float = 120) -> None:
        """Every message answered 202 is recorded in MongoDB, pushed to its subscribers and
        marked delivered; prints duplicates and extra (not 202'd) messages."""
        for code in self.destinations:
            accepted = load.accepted_ids(code)
            if not accepted:
                raise AssertionError(f"the load got no 202 for {code}: {load.summary()}")
            with phases.phase(f"{code}: {len(accepted)} accepted messages recorded in MongoDB"):
                self._wait_for_all(f"{code} recorded in MongoDB", accepted,
                                   functools.partial(self.stored_ids, code), timeout_s)
            for subscription in self.subscription_ids(code):
                with phases.phase(f"{subscription}: pushed to the subscriber"):
                    subscriber = self.subscriber_of[subscription]
                    self._wait_for_all(f"{subscription} pushed to the subscriber", accepted,
                                       subscriber.message_ids, timeout_s)
                with phases.phase(f"{subscription}: marked delivered in MongoDB"):
                    self._wait_for_all(f"{subscription} marked delivered", accepted,
                                       functools.partial(self.delivered_ids, subscription),
                                       timeout_s)
                self._print_extras(subscription, accepted)

    def _wait_for_all(self, what: str, wanted: set[str], have: Callable[[], set[str]],
                      timeout_s: float) -> None:
        def progress() -> tuple[int, int]:
            return len(wanted & have()), len(wanted)

        try:
            wait_with_progress(what, progress, timeout_s)
        except AssertionError as exc:
            missing = wanted - have()
            raise AssertionError(f"{exc}: {len(missing)} of {len(wanted)} missing, e.g.\n"
                                 f"{self.describe(missing)}") from None

    def _print_extras(self, subscription: str, accepted: set[str]) -> None:
        pushes = self.subscriber_of[subscription].pushes
        distinct = {p.message_id for p in pushes}
        stored = self.stored_ids(subscription.split("/", 1)[0])
        say(f"{subscription}: {len(accepted)} accepted (202), {len(stored)} in MongoDB "
            f"({len(stored - accepted)} not answered 202, e.g. cut off by a kill), "
            f"{len(pushes)} pushes of {len(distinct)} distinct messages "
            f"({len(pushes) - len(distinct)} duplicate pushes)")

    # -- tear-down -------------------------------------------------------------------------

    def close(self) -> None:
        # all at once: one grace period, not one per process
        with contextlib.suppress(Exception):
            stop_children([p.process for p in self.processes if p.process is not None],
                          grace_s=20)
        with contextlib.suppress(Exception):
            self.run(self._subscriber_servers.stop(together=True))
        with contextlib.suppress(Exception):
            self.run(self.store.close(), timeout_s=10)
        self.loop.close()
