"""A real msgbus receiver for the client benchmark, in a process of its own, and a port that
refuses every connection (the "receiver is down" of the spooling phases).

`LiveReceiver.start()` starts tansu and SecantusDB on free ports (`msgbus_devtools.servers`),
writes one
producer app (API key) and the benchmark's destinations (Kafka) to MongoDB, and runs
`python -m msgbus_cli receiver` with `MSGBUS_*` variables: the same entry point as
production. It runs in its own process so that the client's threads and the receiver never share
a GIL. Everything it starts is registered on an `ExitStack` and stopped by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import NotInTime, eventually
from pymongo import MongoClient

from bench.report import say
from msgbus import processes
from msgbus.auth import hash_api_key, new_api_key
from msgbus.models import BrokerKind, Destination
from msgbus.store import MongoStore

HOST = "127.0.0.1"
APP_NAME = "bench-client"


class DeadPort:
    """A 127.0.0.1 port that is bound but never listens: every connect is refused at once
    (ECONNREFUSED), and nobody else can take the port while we hold it."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((HOST, 0))
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://{HOST}:{self.port}"

    def close(self) -> None:
        self._sock.close()


class LiveReceiver:
    def __init__(self, workdir: Path, destinations: list[str], stack: contextlib.ExitStack):
        self.workdir = workdir
        self.destinations = destinations
        self.stack = stack
        self.mongo_db = f"bench_client_{secrets.token_hex(4)}"
        self.api_key = new_api_key()
        self.url = ""
        self.mongo_uri = ""

    def start(self, timeout_s: float = 60.0) -> None:
        logs = self.workdir / "logs"
        tansu = services.start_tansu(services.free_port(), logs)
        self.stack.callback(tansu.stop)
        secantus = services.start_secantus(services.free_port(), self.workdir / "mongo", logs)
        self.stack.callback(secantus.stop)
        self.mongo_uri = secantus.url
        asyncio.run(self._prepare_store())
        self._mongo: MongoClient[dict[str, object]] = MongoClient(self.mongo_uri)
        self.stack.callback(self._mongo.close)

        dispatcher = DeadPort()  # no dispatcher: the Kafka path never needs it
        self.stack.callback(dispatcher.close)
        port = services.free_port()
        env = service_env()
        env.update({
            "MSGBUS_MONGO_URI": self.mongo_uri,
            "MSGBUS_MONGO_DB": self.mongo_db,
            "MSGBUS_KAFKA_BOOTSTRAP": tansu.url,
            "MSGBUS_INTERNAL_TOKEN": secrets.token_urlsafe(24),
            "MSGBUS_RECEIVER_HOST": HOST,
            "MSGBUS_RECEIVER_PORT": str(port),
            "MSGBUS_RECEIVER_DISPATCHER_URL": dispatcher.url,
        })
        log_path = logs / "receiver.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "msgbus_cli", "receiver",
                   "--state-dir", str(self.workdir / "receiver-state")]
        say(f"starting the receiver: {' '.join(command)} (log: {log_path})")
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        self.stack.callback(self._stop_process)
        self.url = f"http://{HOST}:{port}"
        self._http = httpx.Client(base_url=self.url, timeout=5)
        self.stack.callback(self._http.close)
        services.wait_ready(f"the receiver on {self.url} (pid {self._process.pid})",
                            self._healthy, timeout_s, self._process, log_path)

    async def _prepare_store(self) -> None:
        store = MongoStore(self.mongo_uri, self.mongo_db)
        try:
            await store.ensure_indexes()
            await store.producers.create_app(APP_NAME, hash_api_key(self.api_key), ["*"])
            for code in self.destinations:
                await store.config.save_destination(Destination(code=code, broker=BrokerKind.KAFKA,
                                                                partitions=1))
        finally:
            await store.close()

    def _healthy(self) -> bool:
        try:
            return self._http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def buffered(self) -> int:
        """Messages the receiver accepted but has not yet published and recorded."""
        return int(sum(self._http.get("/health").json()["buffer"].values()))

    def recorded(self, destination: str) -> int:
        """Messages of `destination` recorded in MongoDB."""
        return self._mongo[self.mongo_db]["messages"].count_documents(
            {"destination": destination})

    def settle(self, destination: str, expected: int, timeout_s: float) -> tuple[int, float]:
        """Wait until the receiver's buffer is empty and MongoDB holds `expected` messages of
        `destination`, so one repetition's background writes do not slow the next.
        Returns (recorded, seconds waited)."""
        began = time.monotonic()
        seen = {"buffered": 0, "recorded": 0}

        def settled() -> bool:
            seen["buffered"], seen["recorded"] = self.buffered(), self.recorded(destination)
            return seen["buffered"] == 0 and seen["recorded"] >= expected

        with contextlib.suppress(NotInTime):  # the caller reports what was recorded
            eventually(settled, timeout_s, "the receiver to record", interval_s=0.1,
                       progress=lambda: (f"{seen['recorded']}/{expected} in MongoDB, "
                                         f"{seen['buffered']} buffered"))
        return seen["recorded"], time.monotonic() - began

    def _stop_process(self) -> None:
        if self._process.poll() is None:
            say(f"stopping the receiver (pid {self._process.pid})")
            processes.stop_process(self._process, 15)
