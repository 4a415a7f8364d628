"""Receivers sharing one buffer root and one port, as real `msgbus receiver` processes on real
tansu and SecantusDB:

- what a receiver killed with -9 had accepted but not yet recorded is flushed into MongoDB by
  another receiver, which then removes the dead one's buffer slot;
- `--workers 2` serves one port from two processes, both accept messages, and a worker that
  dies is replaced;
- each receiver process flushes its buffer in a flush process of its own: one killed with -9 is
  replaced and nothing it left is lost, and it never outlives its receiver;
- /metrics of any worker shows the counts of every worker and flush process.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from msgbus_devtools import servers as services
from msgbus_devtools.testkit import procnet
from msgbus_devtools.testkit.bus import sample_value
from msgbus_devtools.testkit.receiver_proc import HOST, ReceiverProcess, prepare_store
from msgbus_devtools.testkit.tcp_gate import TcpGate
from msgbus_devtools.testkit.waiting import eventually
from pymongo import MongoClient

from msgbus import processes
from msgbus.ids import uuid7

pytestmark = pytest.mark.integration


class Setup:
    def __init__(self, mongo_uri: str, kafka_bootstrap: str, tmp_path: Path) -> None:
        self.mongo_uri = mongo_uri
        self.mongo_db = f"test_{secrets.token_hex(6)}"
        self.destination = f"workers-{secrets.token_hex(4)}"
        self.api_key = prepare_store(mongo_uri, self.mongo_db, [self.destination])
        self.buffer_root = tmp_path / "receiver-buffer"
        self.tmp_path = tmp_path
        self.env = {
            "MSGBUS_MONGO_URI": mongo_uri,
            "MSGBUS_MONGO_DB": self.mongo_db,
            "MSGBUS_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "MSGBUS_INTERNAL_TOKEN": "test-internal-token",
            "MSGBUS_CONFIG_REFRESH_S": "0.5",
            "MSGBUS_RECEIVER_BUFFER_DIR": str(self.buffer_root),
            "MSGBUS_RECEIVER_DISPATCHER_URL": "http://127.0.0.1:9",  # Kafka never needs it
        }
        self.mongo: MongoClient[dict[str, object]] = MongoClient(mongo_uri)
        self.processes: list[ReceiverProcess] = []

    def receiver(self, name: str, *, workers: int = 1, **env: str) -> ReceiverProcess:
        process = ReceiverProcess({**self.env, **env}, services.free_port(),
                                  self.tmp_path / f"{name}.log", workers=workers,
                                  state_dir=self.tmp_path / "state")
        self.processes.append(process)
        return process.start()

    def recorded(self) -> int:
        return self.mongo[self.mongo_db]["messages"].count_documents(
            {"destination": self.destination})

    def close(self) -> None:
        for process in self.processes:
            process.stop()
        self.mongo.close()


@pytest.fixture
def setup(mongo_uri: str, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Setup]:
    running = Setup(mongo_uri, kafka_bootstrap, tmp_path)
    yield running
    running.close()


def send(setup: Setup, port: int, count: int, workers: list[int] | None = None,
         ) -> list[int | None]:
    """POST `count` messages, each on a new connection; returns which of `workers` served
    each one (None when no workers are given)."""
    served_by: list[int | None] = []
    for n in range(count):
        connection = http.client.HTTPConnection(HOST, port, timeout=10)
        try:
            body = json.dumps({"message_id": uuid7(), "body": {"n": n}})
            connection.request("POST", f"/v1/destinations/{setup.destination}/messages", body,
                               {"authorization": f"Bearer {setup.api_key}",
                                "content-type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            assert response.status == 202, answer
            assert json.loads(answer)["status"] == "accepted"
            client_port = connection.sock.getsockname()[1]  # still open: kept alive
            served_by.append(procnet.serving(workers, port, client_port) if workers else None)
        finally:
            connection.close()
    return served_by


def test_a_killed_receivers_buffer_is_flushed_by_another_and_removed(setup: Setup) -> None:
    survivor = setup.receiver("survivor", MSGBUS_RECEIVER_ORPHAN_SCAN_S="0.5",
                              MSGBUS_RECEIVER_ORPHAN_MIN_IDLE_S="0")
    survivor.wait_healthy()
    mongo_port = int(setup.mongo_uri.rsplit(":", 1)[1])
    with TcpGate(HOST, mongo_port) as gate:
        victim = setup.receiver("victim", MSGBUS_MONGO_URI=f"mongodb://{HOST}:{gate.port}")
        victim.wait_healthy()
        [victim_slot] = [s for s in setup.buffer_root.iterdir()
                         if f"pid={victim.pid} " in (s / "slot.lock").read_text()]
        send(setup, victim.port, 1)  # producer key and destination now cached by the victim
        eventually(lambda: setup.recorded() == 1, what="the first message in MongoDB")

        gate.close()  # the victim can no longer record: what it accepts stays in its buffer
        send(setup, victim.port, 50)
        victim.kill()

    eventually(lambda: not victim_slot.exists(), 60,
               f"the survivor to flush and remove {victim_slot.name}\n{survivor.log()}")
    assert setup.recorded() == 51
    assert "adopting the orphaned receiver buffer" in survivor.log()  # and said so
    # its own only, once the adopted slot, renamed ".removing-..." first, is deleted too
    eventually(lambda: sorted(p.name for p in setup.buffer_root.iterdir()) == ["slot-0"], 30,
               "only the survivor's own slot left")


def test_two_workers_share_one_port_and_a_dead_one_is_replaced(setup: Setup) -> None:
    parent = setup.receiver("workers", workers=2)
    parent.wait_healthy()

    def listening_workers() -> list[int] | None:
        workers = procnet.children_of(parent.pid)
        ready = len(workers) == 2 and procnet.listening(workers, parent.port) == set(workers)
        return workers if ready else None

    workers = eventually(listening_workers, 60, "two workers listening on one port")
    served_by = set(send(setup, parent.port, 40, workers))
    assert served_by == set(workers)  # the kernel spreads connections over both processes
    eventually(lambda: setup.recorded() == 40, what="40 messages in MongoDB")
    assert sorted(p.name for p in setup.buffer_root.iterdir()) == ["slot-0", "slot-1"]

    os.kill(workers[0], signal.SIGKILL)
    replaced = eventually(lambda: (w := listening_workers()) and workers[0] not in w and w,
                          60, f"a new worker instead of pid {workers[0]}\n{parent.log()}")
    assert workers[1] in replaced
    send(setup, parent.port, 20)
    eventually(lambda: setup.recorded() == 60, what="60 messages in MongoDB")
    assert sorted(p.name for p in setup.buffer_root.iterdir()) == ["slot-0", "slot-1"]

    assert parent.stop() == 0
    assert not any(processes.pid_alive(pid) for pid in replaced)


def flush_pid(receiver: ReceiverProcess) -> int | None:
    """The pid of the receiver's flush process, as its /health reports it."""
    try:
        health = httpx.get(f"{receiver.url}/health", timeout=5).json()
    except httpx.HTTPError:
        return None
    flusher = health["flusher"]
    assert flusher["mode"] == "process"
    return flusher["pid"]


def gone(pid: int) -> bool:
    """The process exited (a zombie waiting for its new parent to reap it counts as exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_a_killed_flush_process_is_replaced_and_what_it_left_is_recorded(setup: Setup) -> None:
    mongo_port = int(setup.mongo_uri.rsplit(":", 1)[1])
    with TcpGate(HOST, mongo_port) as gate:
        receiver = setup.receiver("receiver", MSGBUS_MONGO_URI=f"mongodb://{HOST}:{gate.port}")
        receiver.wait_healthy()
        first = eventually(lambda: flush_pid(receiver), what="the flush process")
        assert first in procnet.children_of(receiver.pid)
        send(setup, receiver.port, 1)
        eventually(lambda: setup.recorded() == 1, what="the first message in MongoDB")

        gate.close()  # what the receiver accepts now waits in its buffer
        send(setup, receiver.port, 50)
        os.kill(first, signal.SIGKILL)
        second = eventually(lambda: (pid := flush_pid(receiver)) != first and pid,
                            30, f"a new flush process\n{receiver.log()}")
        send(setup, receiver.port, 50)  # the receiver never stopped answering
        gate.open()
        eventually(lambda: setup.recorded() == 101, 60,
                   f"101 messages in MongoDB\n{receiver.log()}")

    assert "receiver flush process (pid" in receiver.log()  # the restart is logged
    receiver.kill()  # kill -9: its flush process must not outlive it
    eventually(lambda: gone(second), 10, f"flush process {second} to exit")


def test_metrics_of_every_worker_and_flush_process_show_on_any_worker(setup: Setup) -> None:
    parent = setup.receiver("workers", workers=2)
    parent.wait_healthy()
    eventually(lambda: len(procnet.children_of(parent.pid)) == 2, 60, "two workers")
    send(setup, parent.port, 40)
    eventually(lambda: setup.recorded() == 40, what="40 messages in MongoDB")

    def published() -> float:  # by the workers' flush processes
        text = httpx.get(f"{parent.url}/metrics", timeout=5).text
        return sample_value(text, "msgbus_published_total", {"broker": "kafka", "outcome": "ok"})

    eventually(lambda: published() == 40, what="40 publishes on /metrics")
    for _ in range(6):  # each new connection may land on either worker
        text = httpx.get(f"{parent.url}/metrics", timeout=5).text
        assert sample_value(text, "msgbus_messages_accepted_total",
                            {"destination": setup.destination}) == 40  # both workers' counts
        assert published() == 40
    assert parent.stop() == 0
