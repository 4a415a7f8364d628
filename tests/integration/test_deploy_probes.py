"""What the Kubernetes probes and the termination of a pod rely on: /ready of every service
answers from real dependency checks (503 when a required one fails, /health still answering for
the liveness probe), and every service run as the pods run it (`msgbus <service>`) stops on
SIGTERM with exit status 0 well within its termination grace period."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import eventually
from pydantic import SecretStr

from compensator.app import create_app as compensator_app
from compensator.service import CompensatorService
from msgbus.settings import CompensatorSettings, ConnectionSettings
from msgbus.store import MongoStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GRACE_PERIOD_S = 30  # deploy/k8s/base: terminationGracePeriodSeconds of these Deployments


def test_every_service_is_ready_on_the_running_bus(bus: RunningBus) -> None:
    required = {bus.receiver_url: "buffer_has_room", bus.dispatcher_url: "trace_buffer_has_room",
                bus.compensator_url: "mongo", bus.admin_url: "mongo"}
    for url, check in required.items():
        response = httpx.get(f"{url}/ready", timeout=10)
        assert response.status_code == 200, (url, response.text)
        body = response.json()
        assert body["ready"] is True and body["checks"][check] is True
        assert body["checks"]["mongo"] is True


def test_a_compensator_without_mongo_is_not_ready_but_alive() -> None:
    dead = f"mongodb://127.0.0.1:{services.free_port()}"
    conn = ConnectionSettings(mongo_uri=dead, internal_token=SecretStr("t"))
    service = CompensatorService(CompensatorSettings(connections=conn))
    service.store = MongoStore(dead, "msgbus", timeout_ms=300)  # fail fast, not in 5 s
    app = compensator_app(service)

    async def probe() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)  # no lifespan: the service never connects
        async with httpx.AsyncClient(transport=transport, base_url="http://compensator") as c:
            return await c.get("/ready"), await c.get("/metrics"), await c.get("/health")

    ready, metrics, health = asyncio.run(probe())
    assert health.status_code == 200 and health.json()["mongo"] is False  # liveness holds
    assert ready.status_code == 503
    assert ready.json()["checks"] == {"mongo": False}
    assert 'msgbus_mongo_up{service="compensator"} 0.0' in metrics.text


def test_services_stop_on_sigterm_with_status_0(bus: RunningBus, tmp_path: Path,
                                                 mongo_db_name: str) -> None:
    conn = bus.connections
    base_env = service_env()
    # a database of their own: they must not join the consumer groups of the bus's subscriptions
    base_env.update({"MSGBUS_MONGO_URI": conn.mongo_uri, "MSGBUS_MONGO_DB": mongo_db_name,
                     "MSGBUS_KAFKA_BOOTSTRAP": conn.kafka_bootstrap,
                     "MSGBUS_RABBITMQ_URL": conn.rabbitmq_url,
                     "MSGBUS_INTERNAL_TOKEN": "t", "MSGBUS_ADMIN_TOKEN": "a"})
    started: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name in ("dispatcher", "compensator", "admin"):
            port = services.free_port()
            env = {**base_env, f"MSGBUS_{name.upper()}_PORT": str(port)}
            log = (tmp_path / f"{name}.log").open("wb")
            started[name] = (subprocess.Popen(
                [sys.executable, "-m", "msgbus_cli", name, "--state-dir", str(tmp_path / name)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), port)
        for name, (process, port) in started.items():
            eventually(lambda p=port, pr=process: ready(p) or pr.poll() is not None, 60,
                       f"{name} /ready")
            assert process.poll() is None, (tmp_path / f"{name}.log").read_text()
        for process, _ in started.values():
            process.send_signal(signal.SIGTERM)
        for name, (process, _) in started.items():
            code = process.wait(GRACE_PERIOD_S)
            assert code == 0, f"{name}: {code}\n" + (tmp_path / f"{name}.log").read_text()
    finally:
        for process, _ in started.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
