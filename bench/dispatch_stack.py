"""What `python -m bench.dispatch` runs, started from scratch on 127.0.0.1 and stopped by PID.

- tansu (Kafka protocol) and SecantusDB (MongoDB protocol) on free ports
  (`msgbus_devtools.servers`);
- two subscriber processes (bench/dispatch_subscriber.py): "sub" for the healthy subscribers
  and the raw baseline, "neighbours" for the hanging, failing and slow ones, so that serving
  the bad neighbours never costs the healthy subscriber's process anything;
- one dispatcher (`msgbus dispatcher`) and one receiver (`msgbus receiver --workers 1`, with
  its flush process), the production entry points, each in processes of their own; with
  `full=True` (bench.e2e) also one `msgbus compensator`, and the machine's RabbitMQ;
- a one-process `ProcessPoolExecutor` (spawn) for the load generators (bench/dispatch_load.py).

Destinations (Kafka) and subscriptions are written to MongoDB with the product's `MongoStore`;
a subscription is paused and resumed by saving it again, as the admin API does, and the
dispatcher follows within one registry refresh (`MSGBUS_CONFIG_REFRESH_S`, 1 s here).
Every process is registered on the caller's ExitStack, so it is stopped also on Ctrl-C or an
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import secrets
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.certs import ServerTls
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import eventually
from pydantic import HttpUrl

from bench.dispatch_load import body
from bench.procs import process_cpu_s, stop_process, tree_cpu_s
from bench.report import say
from msgbus.auth import hash_api_key, new_api_key
from msgbus.ids import uuid7
from msgbus.models import BrokerKind, Destination, Subscription
from msgbus.push_credentials import PushAuth
from msgbus.store import MongoStore

HOST = "127.0.0.1"
APP_NAME = "bench-dispatch"
PRELOAD_BATCH = 500  # the receiver's max_batch_count

T = TypeVar("T")


def with_store(mongo_uri: str, mongo_db: str, work: Callable[[MongoStore], Awaitable[T]]) -> T:
    """`await work(store)` on a MongoStore of that database, opened for it alone, in a new event
    loop."""
    async def run() -> T:
        store = MongoStore(mongo_uri, mongo_db)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


class DispatchStack:
    def __init__(self, workdir: Path, stack: contextlib.ExitStack, *, full: bool = False,
                 settings: dict[str, str] | None = None, mongo_nice: int = 0) -> None:
        self.workdir = workdir
        self.stack = stack
        self.full = full  # a compensator and RabbitMQ too: the whole bus
        self.settings = settings or {}  # MSGBUS_* variables of every bus process
        self.mongo_nice = mongo_nice  # SecantusDB's nice value (services.start_secantus)
        self.logs = workdir / "logs"
        self.run_id = secrets.token_hex(3)
        self.mongo_db = f"bench_dispatch_{self.run_id}"
        self.api_key = new_api_key()
        self.subscriptions: dict[str, Subscription] = {}
        self._processes: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.env: dict[str, str] = {}
        self.stopped: set[str] = set()  # processes stopped on purpose (the replicas phase)
        self._readers: dict[str, httpx.Client] = {}  # base URL -> client (https subscribers)

    # ---- start ---------------------------------------------------------------------------

    def start(self) -> None:
        tansu = services.start_tansu(services.free_port(), self.logs)
        self.stack.callback(tansu.stop)
        secantus = services.start_secantus(services.free_port(), self.workdir / "mongo", self.logs,
                                           nice=self.mongo_nice)
        self.stack.callback(secantus.stop)
        # every process whose CPU the capacity phase accounts for, by role
        self.cpu_pids: dict[str, int] = {"tansu": tansu.pid, "mongo": secantus.pid}
        self.mongo_uri = secantus.url
        self.http = httpx.Client(timeout=30)
        self.stack.callback(self.http.close)
        self.env = service_env({
            "MSGBUS_MONGO_URI": self.mongo_uri, "MSGBUS_MONGO_DB": self.mongo_db,
            "MSGBUS_KAFKA_BOOTSTRAP": tansu.url, "MSGBUS_CONFIG_REFRESH_S": "1",
            "MSGBUS_INTERNAL_TOKEN": secrets.token_urlsafe(24),
        })
        if self.full:
            self.env["MSGBUS_RABBITMQ_URL"] = services.ensure_rabbitmq().url
        self.env.update(self.settings)
        self._with_store(self._prepare_store)

        self.sub_url = self._start_subscriber("sub")
        self.cpu_pids["subscriber"] = self._processes[-1][1].pid
        self.neighbours_url = self._start_subscriber("neighbours")

        port = services.free_port()
        self.dispatcher_url = f"http://{HOST}:{port}"
        self.dispatcher = self._spawn("dispatcher", self._msgbus("dispatcher"),
                                      MSGBUS_DISPATCHER_HOST=HOST,
                                      MSGBUS_DISPATCHER_PORT=str(port))
        port = services.free_port()
        self.receiver_url = f"http://{HOST}:{port}"
        receiver = self._spawn("receiver", [*self._msgbus("receiver"), "--workers", "1"],
                               MSGBUS_RECEIVER_HOST=HOST, MSGBUS_RECEIVER_PORT=str(port),
                               MSGBUS_RECEIVER_DISPATCHER_URL=self.dispatcher_url)
        self.cpu_pids.update(dispatcher=self.dispatcher.pid, receiver=receiver.pid)
        self._wait_healthy("dispatcher", self.dispatcher_url)
        self._wait_healthy("receiver", self.receiver_url)
        if self.full:
            port = services.free_port()
            compensator = self._spawn("compensator", self._msgbus("compensator"),
                                      MSGBUS_COMPENSATOR_HOST=HOST,
                                      MSGBUS_COMPENSATOR_PORT=str(port))
            self.cpu_pids["compensator"] = compensator.pid
            self._wait_healthy("compensator", f"http://{HOST}:{port}")

        self.load = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self.stack.callback(self.load.shutdown, wait=True, cancel_futures=True)

    def _start_subscriber(self, name: str, tls: ServerTls | None = None) -> str:
        port = services.free_port()
        files = "" if tls is None else (
            f", {str(tls.cert_file)!r}, {str(tls.key_file)!r}, "
            f"{str(tls.client_ca_file) if tls.client_ca_file else None!r}")
        self._spawn(name, [sys.executable, "-c",
                           f"from bench.dispatch_subscriber import serve; serve({port}{files})"])
        services.wait_for_port(HOST, port, 30)
        return f"{'http' if tls is None else 'https'}://{HOST}:{port}"

    def start_subscriber(self, name: str, tls: ServerTls, reader: ssl.SSLContext) -> str:
        """One more subscriber process (bench/dispatch_subscriber.py) serving https with `tls`
        (the auth phase); returns its base URL. The benchmark reads its arrivals with a client
        of the TLS context `reader` (the CA to trust, and a client certificate for mTLS)."""
        url = self._start_subscriber(name, tls)
        self._readers[url] = httpx.Client(timeout=30, verify=reader)
        self.stack.callback(self._readers[url].close)
        return url

    def start_process(self, name: str, command: list[str], port: int) -> subprocess.Popen[bytes]:
        """Another process of the benchmark's own (the auth phase's OAuth2 server), its output
        in logs/<name>.log, stopped by PID with the rest; once it listens on `port`."""
        process = self._spawn(name, command)
        services.wait_for_port(HOST, port, 30)
        self.check_alive()
        return process

    def log_path(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def _msgbus(self, command: str) -> list[str]:
        return [sys.executable, "-m", "msgbus_cli", command,
                "--state-dir", str(self.workdir / command / "state")]

    def _spawn(self, name: str, command: list[str], **env: str) -> subprocess.Popen[bytes]:
        log_path = self.logs / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, env={**self.env, **env}, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.stack.callback(stop_process, process, name)
        self._processes.append((name, process, log_path))
        return process

    def start_more_dispatchers(self, count: int) -> list[subprocess.Popen[bytes]]:
        """`count` more dispatcher processes, each with a state directory of its own, once
        healthy (the replicas phase; `stop_process` them after)."""
        started = []
        for index in range(1, count + 1):
            name, port = f"dispatcher-{index}", services.free_port()
            command = [sys.executable, "-m", "msgbus_cli", "dispatcher", "--state-dir",
                       str(self.workdir / name / "state")]
            started.append(self._spawn(name, command, MSGBUS_DISPATCHER_HOST=HOST,
                                       MSGBUS_DISPATCHER_PORT=str(port),
                                       MSGBUS_DISPATCHER_INSTANCE=name))
            self._wait_healthy(name, f"http://{HOST}:{port}")
        return started

    def check_alive(self) -> None:
        for name, process, log_path in self._processes:
            if process.poll() is not None and name not in self.stopped:
                raise RuntimeError(f"{name} exited with code {process.returncode}"
                                   + services.log_tail(log_path))

    def _wait_healthy(self, name: str, url: str, timeout_s: float = 60) -> None:
        def healthy() -> bool:
            self.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                return self.http.get(f"{url}/health").status_code == 200
            return False

        began = time.monotonic()
        eventually(healthy, timeout_s, f"{name} start", interval_s=0.1)
        say(f"{name} ready on {url} after {time.monotonic() - began:.1f} s")

    # ---- MongoDB: the app, destinations, subscriptions ------------------------------------

    def _with_store(self, work: Callable[[MongoStore], Awaitable[T]]) -> T:
        return with_store(self.mongo_uri, self.mongo_db, work)

    async def _prepare_store(self, store: MongoStore) -> None:
        await store.ensure_indexes()
        await store.producers.create_app(APP_NAME, hash_api_key(self.api_key), ["*"])

    def create(self, code: str, subscribers: dict[str, str], *, concurrency: int,
               timeout_ms: int, broker: BrokerKind = BrokerKind.KAFKA,
               partitions: int = 4, auth: PushAuth | None = None) -> list[str]:
        """A destination with paused subscriptions {name: url}, each with `auth` (how its
        pushes authenticate; stored as given, unsealed); returns their ids."""
        # every dispatcher serves every subscription: the replicas phase shares one cap
        subs = [Subscription(destination=code, name=name, url=HttpUrl(url), paused=True,
                             max_concurrency=concurrency, timeout_ms=timeout_ms, auth=auth,
                             dispatchers=None)
                for name, url in subscribers.items()]

        async def save(store: MongoStore) -> None:
            await store.config.save_destination(Destination(code=code, broker=broker,
                                                            partitions=partitions))
            for sub in subs:
                await store.config.save_subscription(sub)

        self._with_store(save)
        self.subscriptions.update({s.id: s for s in subs})
        return [s.id for s in subs]

    def stages(self, message_ids: list[str]) -> dict[str, tuple[float, float]]:
        """Per message id: when the receiver accepted it and when its first push began (unix
        times, from the bus's own records in MongoDB)."""
        async def read(store: MongoStore) -> dict[str, tuple[float, float]]:
            received: dict[str, float] = {}
            pushed: dict[str, float] = {}
            for lo in range(0, len(message_ids), 1000):
                chunk = message_ids[lo:lo + 1000]
                async for doc in store.db.messages.find({"_id": {"$in": chunk}},
                                                        {"received_at": 1}):
                    received[doc["_id"]] = doc["received_at"].timestamp()
                async for doc in store.db.attempts.find({"message_id": {"$in": chunk},
                                                         "attempt": 1},
                                                     {"message_id": 1, "started_at": 1}):
                    pushed[doc["message_id"]] = doc["started_at"].timestamp()
            return {mid: (received[mid], pushed[mid]) for mid in received if mid in pushed}

        return self._with_store(read)

    def set_paused(self, sub_ids: list[str], paused: bool) -> None:
        changed = [self.subscriptions[i].model_copy(update={"paused": paused})
                   for i in sub_ids]

        async def save(store: MongoStore) -> None:
            for sub in changed:
                await store.config.save_subscription(sub)

        self._with_store(save)
        self.subscriptions.update({s.id: s for s in changed})

    def running_workers(self) -> set[str]:
        return set(self.http.get(f"{self.dispatcher_url}/health").json()["subscriptions"])

    def wait_workers_stopped(self, sub_ids: list[str], timeout_s: float = 60) -> None:
        eventually(lambda: not self.running_workers() & set(sub_ids), timeout_s,
                   "stopping workers", interval_s=0.2,
                   progress=lambda: f"running {sorted(self.running_workers() & set(sub_ids))}")

    # ---- the receiver ---------------------------------------------------------------------

    def preload(self, code: str, start: int, count: int) -> None:
        """Send messages n = start .. start+count-1 through the receiver in batches."""
        headers = {"authorization": f"Bearer {self.api_key}"}
        for lo in range(start, start + count, PRELOAD_BATCH):
            hi = min(lo + PRELOAD_BATCH, start + count)
            messages = [{"message_id": uuid7(), "destination": code, "body": body(n)}
                        for n in range(lo, hi)]
            response = self.http.post(f"{self.receiver_url}/v1/messages", headers=headers,
                                      json={"messages": messages})
            response.raise_for_status()
            refused = [r for r in response.json()["results"] if r["status"] != 202]
            if refused:
                raise RuntimeError(f"the receiver refused {len(refused)} messages of {code}: "
                                   f"{refused[0]}")

    def receiver_buffered(self) -> int:
        return int(sum(self.http.get(f"{self.receiver_url}/health").json()["buffer"].values()))

    def trace_backlog(self) -> int:
        return int(self.http.get(f"{self.dispatcher_url}/health").json()["trace_backlog"])

    def wait_quiet(self, what: str, timeout_s: float) -> float:
        """Wait until the receiver has published and recorded everything it accepted and the
        dispatcher has written its trace to MongoDB, so one phase's background writes do not
        slow the next. Returns the seconds waited."""
        began = time.monotonic()
        eventually(lambda: self.receiver_buffered() == 0 and self.trace_backlog() == 0,
                   timeout_s, f"{what}: settling", interval_s=0.25,
                   progress=lambda: (f"receiver buffer {self.receiver_buffered()}, dispatcher "
                                     f"trace backlog {self.trace_backlog()}"))
        return time.monotonic() - began

    # ---- the subscribers ------------------------------------------------------------------

    def _reader(self, base_url: str) -> httpx.Client:
        return self._readers.get(base_url, self.http)

    def count(self, base_url: str, label: str, lo: int, hi: int) -> dict[str, int]:
        return dict(self._reader(base_url).get(f"{base_url}/_count/{label}",
                                               params={"lo": lo, "hi": hi}).json())

    def records(self, base_url: str, label: str, lo: int,
                hi: int) -> list[tuple[int, float, float]]:
        rows = self._reader(base_url).get(f"{base_url}/_records/{label}",
                                          params={"lo": lo, "hi": hi}).json()
        return [(int(n), float(s), float(a)) for n, s, a in rows]

    def peak(self, base_url: str, label: str) -> int:
        return int(self._reader(base_url).get(f"{base_url}/_peak/{label}").json()["peak"])

    def hits(self, base_url: str, label: str) -> int:
        return int(self._reader(base_url).get(f"{base_url}/_hits/{label}").json()["hits"])

    def submit(self, fn: Callable[..., dict[str, Any]], **kwargs: Any) -> Future[dict[str, Any]]:
        return self.load.submit(fn, **kwargs)

    def dispatcher_cpu_s(self) -> float:
        return process_cpu_s(self.dispatcher.pid)

    def stack_cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of each process of the stack, by role (with its children)."""
        return {role: tree_cpu_s(pid) for role, pid in self.cpu_pids.items()}
