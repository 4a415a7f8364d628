"""Services that reach MongoDB through a `TcpGate`, for tests of what operators see while it
hangs (`gate.freeze()`): an admin in-process (`admin_through`) and bus services as separate OS
processes (`ServiceProcesses`), each on a MongoDB URI of its own, so that some of them see
MongoDB hang while the others do not. The MongoDB server itself is never stopped: freezing a
gate freezes only the connections through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import SecretStr

from admin.app import create_app as admin_app
from admin.service import AdminService
from msgbus.serving import ServerGroup, make_server
from msgbus.settings import AdminSettings, ConnectionSettings
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.loop import BackgroundLoop
from msgbus_devtools.testkit.procs import BusProcess

INTERNAL_TOKEN = "test-internal-token"


@contextlib.contextmanager
def admin_through(mongo_uri: str, mongo_db: str, token: str, state_dir: Path) -> Iterator[str]:
    """An admin on `mongo_uri` in this process, on its own loop; yields its URL."""
    loop = BackgroundLoop()
    group = ServerGroup()
    port = services.free_port()
    settings = AdminSettings(port=port, token=SecretStr(token), connections=ConnectionSettings(
        mongo_uri=mongo_uri, mongo_db=mongo_db, state_dir=state_dir))

    async def start() -> None:
        await group.start(make_server(admin_app(AdminService(settings)), services.HOST, port),
                          "admin")

    try:
        loop.run(start())
        yield f"http://{services.HOST}:{port}"
    finally:
        loop.run(group.stop(), timeout_s=60)
        loop.close()


class ServiceProcesses:
    """Bus services (`python -m msgbus_cli <service>`) of one MongoDB database, each on the
    MongoDB URI it is given, on ports of their own; started together, stopped by PID."""

    def __init__(self, work_dir: Path, mongo_db: str, admin_token: str) -> None:
        self.work_dir = work_dir
        self.mongo_db = mongo_db
        self.admin_token = admin_token
        self.processes: list[BusProcess] = []

    def add(self, service: str, name: str, mongo_uri: str, **settings: str) -> BusProcess:
        """`settings`: its own MSGBUS_<SERVICE>_* variables (e.g. dispatcher_url)."""
        prefix = f"MSGBUS_{service.upper()}_"
        port = services.free_port()
        env = {"MSGBUS_MONGO_URI": mongo_uri, "MSGBUS_MONGO_DB": self.mongo_db,
               "MSGBUS_INTERNAL_TOKEN": INTERNAL_TOKEN, "MSGBUS_ADMIN_TOKEN": self.admin_token,
               "MSGBUS_STATE_DIR": str(self.work_dir / name), "MSGBUS_CONFIG_REFRESH_S": "0.5",
               f"{prefix}PORT": str(port),
               **{f"{prefix}{key.upper()}": value for key, value in settings.items()}}
        process = BusProcess(service, name, port, env, self.work_dir)
        self.processes.append(process)
        return process

    def start_all(self, timeout_s: float = 60) -> None:
        """Every process added, started at once (each waits for its own /health)."""
        with ThreadPoolExecutor(len(self.processes)) as pool:
            for started in [pool.submit(p.start, timeout_s) for p in self.processes]:
                started.result()

    def stop_all(self) -> None:
        with ThreadPoolExecutor(max(1, len(self.processes))) as pool:
            list(pool.map(lambda p: p.stop(), self.processes))
