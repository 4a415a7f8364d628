"""GET /v1/services, the dashboard's Services panel (issue 37, "operators see it"): every service
process advertises its /health in its heartbeat, and the admin shows which of them see MongoDB
as unavailable. A receiver and a dispatcher reach MongoDB through a TcpGate that the test
freezes; a compensator and the admin reach it directly: only the first two (and the receiver's
flush process) turn unavailable, and available again once the gate thaws. The receiver,
dispatcher and compensator are separate OS processes (the admin runs in the test's, which saves
a process start of several seconds). Named `admin` so that `pytest -k admin` selects them."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from msgbus_devtools.testkit.mongo_outage import ServiceProcesses, admin_through
from msgbus_devtools.testkit.tcp_gate import TcpGate, mongo_uri_through
from msgbus_devtools.testkit.waiting import eventually

TOKEN = "services-admin-token"
SEES_IT_S = 30  # a gate closes at its process's next MongoDB call that times out (<= 5 s)


@pytest.fixture
def processes(mongo_db_name: str, tmp_path: Path, mongo_gate: TcpGate) -> Iterator[
        ServiceProcesses]:
    made = ServiceProcesses(tmp_path, mongo_db_name, TOKEN)
    try:
        yield made
    finally:
        mongo_gate.thaw()
        made.stop_all()


@pytest.fixture
def admin_url(mongo_uri: str, mongo_db_name: str, tmp_path: Path) -> Iterator[str]:
    with admin_through(mongo_uri, mongo_db_name, TOKEN, tmp_path / "admin") as url:
        yield url


def _by_instance(admin_url: str) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{admin_url}/v1/services", timeout=10,
                       headers={"authorization": f"Bearer {TOKEN}"})
    answer.raise_for_status()
    return {row["instance"]: row for row in answer.json()["services"]}


def _gates(row: dict[str, Any]) -> list[bool | None]:
    """Whether the process (and a receiver's flush process) sees MongoDB as available; None
    while unknown."""
    seen = [(row.get("mongo") or {}).get("available")]
    if row.get("component") == "receiver":
        seen.append(((row.get("flusher") or {}).get("mongo") or {}).get("available"))
    return seen


def test_admin_services_shows_which_processes_see_mongodb_unavailable(
        processes: ServiceProcesses, mongo_gate: TcpGate, mongo_uri: str,
        admin_url: str) -> None:
    gated = mongo_uri_through(mongo_gate)
    dispatcher = processes.add("dispatcher", "dispatcher-gated", gated,
                               instance="dispatcher-gated")
    receiver = processes.add("receiver", "receiver-gated", gated,
                             dispatcher_url=dispatcher.url)
    compensator = processes.add("compensator", "compensator-direct", mongo_uri,
                                instance="compensator-direct")
    processes.start_all()
    host = socket.gethostname()
    urls = {"dispatcher:dispatcher-gated": dispatcher.url,
            f"receiver:{host}-{receiver.pid}": receiver.url,
            "compensator:compensator-direct": compensator.url,
            f"admin:{host}-{os.getpid()}": admin_url}
    instances = set(urls)
    frozen = {"dispatcher:dispatcher-gated", f"receiver:{host}-{receiver.pid}"}

    def all_available() -> bool:
        rows = _by_instance(admin_url)
        return instances <= set(rows) and all(
            _gates(rows[name]) in ([True], [True, True]) for name in instances)

    eventually(all_available, SEES_IT_S, "every service listed, seeing MongoDB available")
    rows = _by_instance(admin_url)
    for name, url in urls.items():
        assert rows[name]["health_url"] == f"{url}/health"
    assert rows[f"receiver:{host}-{receiver.pid}"]["flusher"]["mode"] == "process"

    mongo_gate.freeze()

    def only_frozen_unavailable() -> bool:
        rows = _by_instance(admin_url)
        return all(_gates(rows[name]) in ([False], [False, False]) for name in frozen) and all(
            _gates(rows[name]) == [True] for name in instances - frozen)

    eventually(only_frozen_unavailable, SEES_IT_S,
               "the receiver, its flush process and the dispatcher to see MongoDB unavailable")
    down = _by_instance(admin_url)["dispatcher:dispatcher-gated"]["mongo"]
    assert down["since"] and down["closed_by"] and down["reason"]

    mongo_gate.thaw()
    eventually(all_available, SEES_IT_S, "every service to see MongoDB available again")
