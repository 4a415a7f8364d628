"""What `python -m bench.ingest` measures, started from scratch on 127.0.0.1 and stopped by PID.

- tansu (Kafka protocol) and SecantusDB (MongoDB protocol) on free ports
  (`msgbus_devtools.servers`),
  the machine's RabbitMQ (`ensure_rabbitmq`);
- in MongoDB: one producer app, and per receiver and broker a destination with one paused
  subscription (so RabbitMQ routes every message to a durable queue and the receiver records a
  pending delivery per message, as with a real subscriber, while no dispatcher pushes compete
  for the CPU during a measurement);
- for the payload schema phase, two more destinations on the first broker, like the others:
  one with `SCHEMA_20_FIELDS` as its schema, one without;
- a dispatcher (`msgbus dispatcher`) and a trivial subscriber, so that a message a broker
  refuses takes the direct path as in production;
- the targets, each in processes of their own: the receiver with 1 and with 2 workers
  (`msgbus receiver --workers N`, the production entry point) and the bare FastAPI endpoint
  (bench/bare_app.py) with 1 and 2 processes on one port.
Every process is registered on the caller's ExitStack, so it is stopped also on Ctrl-C or an
error; the RabbitMQ exchanges and queues it declared are deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import NotInTime, eventually
from pydantic import HttpUrl
from pymongo import MongoClient

from bench.buffers import pending_entries
from bench.procs import stop_process, tree_cpu_s
from bench.report import say
from msgbus.auth import hash_api_key, new_api_key
from msgbus.brokers.base import consumer_name, topic_name
from msgbus.models import BrokerKind, Destination, SchemaCompatibility, Subscription
from msgbus.store import MongoStore
from msgbus.store.schemas import SchemaStore
from receiver.bufferslots import holder_of, slots

HOST = "127.0.0.1"
APP_NAME = "bench-ingest"
SUBSCRIPTION = "sink"


def _text(max_length: int, **more: Any) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length, **more}


# The schema of the payload schema phase: the 20 fields of bench/wrk/ingest.lua's "fields20"
# body, each typed and bounded, all required, nothing else allowed.
SCHEMA_20_FIELDS: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "order_id": _text(64, pattern="^o-"), "customer": _text(64),
        "amount": {"type": "number", "minimum": 0},
        "currency": {"enum": ["EUR", "USD", "GBP", "CHF"]},
        "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
        "country": _text(2, minLength=2), "city": _text(100), "zip": _text(10),
        "street": _text(200), "email": _text(254, format="email"), "phone": _text(20),
        "channel": {"enum": ["web", "app", "store"]},
        "priority": {"type": "integer", "minimum": 0, "maximum": 9},
        "gift": {"type": "boolean"}, "discount": {"type": "number", "minimum": 0},
        "tax": {"type": "number", "minimum": 0}, "shipping": {"type": "number", "minimum": 0},
        "weight_g": {"type": "integer", "minimum": 0},
        "items": {"type": "array", "minItems": 1, "maxItems": 100, "items": {
            "type": "object", "required": ["sku", "qty"], "additionalProperties": False,
            "properties": {"sku": _text(64), "qty": {"type": "integer", "minimum": 1}}}},
        "note": _text(1000),
    },
    "additionalProperties": False,
}
SCHEMA_20_FIELDS["required"] = list(SCHEMA_20_FIELDS["properties"])


@dataclass
class Target:
    """Something wrk sends to: a receiver (with its buffer root) or the bare endpoint."""

    name: str
    url: str
    workers: int
    buffer_root: Path | None = None

    @property
    def is_receiver(self) -> bool:
        return self.buffer_root is not None


class IngestStack:
    def __init__(self, workdir: Path, stack: contextlib.ExitStack, brokers: list[str], *,
                 receiver_env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.receiver_env = receiver_env or {}
        self.stack = stack
        self.brokers = brokers
        self.logs = workdir / "logs"
        self.run_id = secrets.token_hex(3)
        self.mongo_db = f"bench_ingest_{self.run_id}"
        self.api_key = new_api_key()
        self.internal_token = secrets.token_urlsafe(24)
        self.destinations: dict[tuple[int, str], str] = {
            (workers, broker): f"ingest-{self.run_id}-w{workers}-{broker}"
            for workers in (1, 2) for broker in brokers}
        # the payload schema phase's destinations, on the first broker: "with" has
        # SCHEMA_20_FIELDS, "without" no schema
        self.schema_destinations = {
            kind: f"ingest-{self.run_id}-{kind}-schema" for kind in ("with", "without")}
        self.bare: dict[int, Target] = {}
        self.receivers: dict[int, Target] = {}
        self.env: dict[str, str] = {}
        self._processes: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    # ---- start ---------------------------------------------------------------------------

    def start(self) -> None:
        tansu = services.start_tansu(services.free_port(), self.logs)
        self.stack.callback(tansu.stop)
        secantus = services.start_secantus(services.free_port(), self.workdir / "mongo", self.logs)
        self.stack.callback(secantus.stop)
        self.mongo_uri = secantus.url
        rabbit = services.ensure_rabbitmq()
        if rabbit.started_by_us:
            self.stack.callback(services.stop_rabbitmq)
        self.rabbitmq_url = rabbit.url
        self.stack.callback(self._delete_rabbitmq_topology)
        self.mongo: MongoClient[dict[str, object]] = MongoClient(self.mongo_uri)
        self.stack.callback(self.mongo.close)
        self.http = httpx.Client(timeout=5)
        self.stack.callback(self.http.close)
        self.env = service_env({
            "MSGBUS_MONGO_URI": self.mongo_uri, "MSGBUS_MONGO_DB": self.mongo_db,
            "MSGBUS_KAFKA_BOOTSTRAP": tansu.url, "MSGBUS_RABBITMQ_URL": self.rabbitmq_url,
            "MSGBUS_INTERNAL_TOKEN": self.internal_token,
        })

        sub_port = services.free_port()
        self._spawn("subscriber", [sys.executable, "-c",
                                   f"from bench.subscriber import serve; serve({sub_port})"])
        services.wait_for_port(HOST, sub_port, 30)
        asyncio.run(self._prepare_store(f"http://{HOST}:{sub_port}/hook"))

        dispatcher_port = services.free_port()
        self._spawn("dispatcher", self._msgbus("dispatcher"),
                    MSGBUS_DISPATCHER_HOST=HOST, MSGBUS_DISPATCHER_PORT=str(dispatcher_port))
        self._wait_healthy("dispatcher", f"http://{HOST}:{dispatcher_port}")
        self.dispatcher_url = f"http://{HOST}:{dispatcher_port}"

        for workers in (1, 2):  # all at once, then wait for each
            self.bare[workers] = self._start_bare(workers)
            self.receivers[workers] = self._start_receiver(workers)
        for target in (*self.bare.values(), *self.receivers.values()):
            root = target.buffer_root
            every_slot_held = None if root is None else (
                lambda r=root, n=target.workers: sum(holder_of(s) is not None
                                                     for s in slots(r)) == n)
            self._wait_healthy(target.name, target.url, every_slot_held)

    def _start_bare(self, workers: int) -> Target:
        port = services.free_port()
        target = Target(f"bare-{workers}w", f"http://{HOST}:{port}", workers)
        for n in range(workers):
            self._spawn(f"{target.name}-{n}", [sys.executable, "-m", "bench.bare_app",
                                               "--port", str(port), "--reuse-port"])
        return target

    def _start_receiver(self, workers: int) -> Target:
        port = services.free_port()
        root = self.workdir / f"receiver-{workers}w" / "buffer"
        target = Target(f"receiver-{workers}w", f"http://{HOST}:{port}", workers, root)
        command = [*self._msgbus("receiver", target.name), "--workers", str(workers)]
        self._spawn(target.name, command,
                    MSGBUS_RECEIVER_HOST=HOST, MSGBUS_RECEIVER_PORT=str(port),
                    MSGBUS_RECEIVER_BUFFER_DIR=str(root),
                    MSGBUS_RECEIVER_DISPATCHER_URL=self.dispatcher_url, **self.receiver_env)
        return target

    def _msgbus(self, command: str, state: str | None = None) -> list[str]:
        state_dir = self.workdir / (state or command) / "state"
        return [sys.executable, "-m", "msgbus_cli", command, "--state-dir", str(state_dir)]

    def _spawn(self, name: str, command: list[str], **env: str) -> subprocess.Popen[bytes]:
        log_path = self.logs / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, env={**self.env, **env} if self.env else None,
                                       stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.stack.callback(stop_process, process, name)
        self._processes.append((name, process, log_path))
        return process

    def _wait_healthy(self, name: str, url: str, also: Callable[[], bool] | None = None,
                      timeout_s: float = 60) -> None:
        def healthy() -> bool:
            for proc_name, process, log_path in self._processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{proc_name} exited with code {process.returncode}"
                                       + services.log_tail(log_path))
            with contextlib.suppress(httpx.HTTPError):
                return (self.http.get(f"{url}/health").status_code == 200
                        and (also is None or also()))
            return False

        began = time.monotonic()
        eventually(healthy, timeout_s, f"{name} start (logs in {self.logs})", interval_s=0.1)
        say(f"{name} ready on {url} after {time.monotonic() - began:.1f} s")

    async def _prepare_store(self, subscriber_url: str) -> None:
        store = MongoStore(self.mongo_uri, self.mongo_db)
        try:
            await store.ensure_indexes()
            await store.producers.create_app(APP_NAME, hash_api_key(self.api_key), ["*"])
            schema_codes = {code: self.brokers[0] for code in self.schema_destinations.values()}
            for code, broker in [*((c, b) for (_, b), c in self.destinations.items()),
                                 *schema_codes.items()]:
                await store.config.save_destination(
                    Destination(code=code, broker=BrokerKind(broker)))
                await store.config.save_subscription(Subscription(
                    destination=code, name=SUBSCRIPTION, url=HttpUrl(f"{subscriber_url}/{code}"),
                    paused=True))
            await SchemaStore(store).add(self.schema_destinations["with"], SCHEMA_20_FIELDS,
                                         SchemaCompatibility.BACKWARD, 1, APP_NAME)
        finally:
            await store.close()

    # ---- between phases ------------------------------------------------------------------

    def recorded(self, id_prefix: str) -> int:
        """Messages recorded in MongoDB whose message_id starts with `id_prefix` (a range of
        the _id index: a count by destination would scan, and slow the flush it waits for)."""
        return self.mongo[self.mongo_db]["messages"].count_documents(
            {"_id": {"$gte": f"{id_prefix}-", "$lt": f"{id_prefix}."}})

    def schema_versions(self, id_prefix: str) -> set[object]:
        """The schema versions recorded for one of the messages of a wrk run (None: none)."""
        doc = self.mongo[self.mongo_db]["messages"].find_one(
            {"_id": {"$gte": f"{id_prefix}-", "$lt": f"{id_prefix}."}}, {"schema_version": 1})
        return {None if doc is None else doc.get("schema_version")}

    def wait_flushed(self, target: Target, timeout_s: float) -> tuple[int, float]:
        """Wait until the target's buffers are empty (everything accepted was published and
        recorded), so that one phase's background writes do not slow the next.
        Returns (entries left, seconds waited)."""
        root = target.buffer_root
        assert root is not None
        began, left = time.monotonic(), 0

        def empty() -> bool:
            nonlocal left
            left = pending_entries(root)
            return left == 0

        with contextlib.suppress(NotInTime):  # what is left is reported
            eventually(empty, timeout_s, f"flushing {target.name}", interval_s=0.25,
                       progress=lambda: f"{left} buffer entries left")
        return left, time.monotonic() - began

    def cpu_s(self, target: Target) -> float:
        """CPU seconds so far of a target's processes (a receiver: its workers and their
        flush processes)."""
        pid = next(p.pid for name, p, _ in self._processes if name == target.name)
        return tree_cpu_s(pid)

    def purge_rabbitmq(self) -> None:
        """Empty the subscription queues (paused: nobody consumes them)."""
        self._on_rabbitmq(lambda channel, code: channel.queue_purge(
            consumer_name(code, SUBSCRIPTION)))

    def _delete_rabbitmq_topology(self) -> None:
        def delete(channel: Any, code: str) -> None:
            channel.queue_delete(consumer_name(code, SUBSCRIPTION))
            channel.exchange_delete(topic_name(code))

        self._on_rabbitmq(delete)

    def _on_rabbitmq(self, action: Callable[[Any, str], object]) -> None:
        import pika
        from pika.exceptions import AMQPError

        codes = [c for (_, broker), c in self.destinations.items() if broker == "rabbitmq"]
        if self.brokers[0] == "rabbitmq":
            codes += self.schema_destinations.values()
        if not codes:
            return
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.rabbitmq_url))
        except AMQPError as exc:
            say(f"RabbitMQ clean-up skipped: {exc!r}")
            return
        try:
            for code in codes:
                channel = connection.channel()
                with contextlib.suppress(AMQPError):  # not declared (yet): nothing to clean
                    action(channel, code)
                if channel.is_open:
                    channel.close()
        finally:
            connection.close()
