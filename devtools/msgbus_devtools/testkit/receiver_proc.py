"""`msgbus receiver` in a process of its own (the production entry point), configured by
`MSGBUS_*` variables, with a producer app and destinations written straight to MongoDB."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from msgbus import processes
from msgbus.auth import hash_api_key, new_api_key
from msgbus.models import BrokerKind, Destination
from msgbus.store import MongoStore
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import eventually

REPO = Path(__file__).resolve().parents[3]  # the repository root
HOST = "127.0.0.1"


def prepare_store(mongo_uri: str, mongo_db: str, destinations: list[str],
                  broker: BrokerKind = BrokerKind.KAFKA) -> str:
    """Create a producer app allowed everywhere and the destinations; returns its API key."""
    api_key = new_api_key()

    async def write() -> None:
        store = MongoStore(mongo_uri, mongo_db)
        try:
            await store.ensure_indexes()
            await store.producers.create_app("tests", hash_api_key(api_key), ["*"])
            for code in destinations:
                await store.config.save_destination(
                    Destination(code=code, broker=broker, partitions=1))
        finally:
            await store.close()

    asyncio.run(write())
    return api_key


class ReceiverProcess:
    """Started with `start()`, stopped by its PID (`stop()` or `kill()`)."""

    def __init__(self, env: dict[str, str], port: int, log_path: Path, *, workers: int = 1,
                 state_dir: Path) -> None:
        self.env = service_env({**env, "MSGBUS_RECEIVER_HOST": HOST,
                                "MSGBUS_RECEIVER_PORT": str(port)})
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.log_path = log_path
        self.command = [sys.executable, "-m", "msgbus_cli", "receiver", "--state-dir",
                        str(state_dir), "--workers", str(workers)]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> ReceiverProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, env=self.env, cwd=REPO,
                                            stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_healthy(self, timeout_s: float = 60) -> None:
        def healthy() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"the receiver exited with {self.process.returncode}:\n"
                                     + self.log())
            try:
                return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(healthy, timeout_s, f"the receiver on {self.url}", interval_s=0.1)

    def kill(self) -> None:
        """kill -9: no shutdown, no cleanup."""
        os.kill(self.pid, signal.SIGKILL)
        assert self.process is not None
        self.process.wait(10)

    def stop(self, timeout_s: float = 40) -> int:
        """SIGTERM, then SIGKILL if it lingers; returns the exit code."""
        assert self.process is not None
        processes.stop_process(self.process, timeout_s)
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
