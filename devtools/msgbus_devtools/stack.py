"""The persistent dev stack of `msgbus services up|down|status`, kept in a state dir.

Files: services.json (pids and ports of what `up` started) and services.env (the MSGBUS_*
addresses, for `set -a; . services.env`). Built from the building blocks in
`msgbus_devtools.servers`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from msgbus.processes import pid_runs
from msgbus_devtools.servers import (
    HOST,
    RABBITMQ_URL,
    Running,
    ServiceError,
    ServiceState,
    amqp_ready,
    ensure_rabbitmq,
    port_accepts,
    say,
    start_secantus,
    start_tansu,
    stop,
    stop_rabbitmq,
)

DEFAULT_STATE_DIR = Path(".msgbus/services")
STATE_FILE = "services.json"
ENV_FILE = "services.env"

MANAGED = {"tansu": "tansu", "secantus": "secantusd-py"}  # name -> fragment of its command line


@dataclass(frozen=True)
class ProcessRecord:
    """What services.json remembers of a server `up` started."""

    pid: int
    port: int
    url: str
    log: str

    @classmethod
    def of(cls, running: Running) -> ProcessRecord:
        return cls(running.pid, running.port, running.url, str(running.log_path))

    def runs(self, name: str) -> bool:
        return pid_runs(self.pid, MANAGED[name])


@dataclass
class StackState:
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    rabbitmq_started_by_us: bool = False

    @classmethod
    def load(cls, state_dir: Path) -> StackState:
        path = Path(state_dir) / STATE_FILE
        if not path.is_file():
            return cls()
        raw = json.loads(path.read_text())
        processes = {name: ProcessRecord(**raw[name]) for name in MANAGED if name in raw}
        return cls(processes, bool(raw.get("rabbitmq", {}).get("started_by_us")))

    def save(self, state_dir: Path) -> None:
        raw: dict[str, object] = {name: asdict(rec) for name, rec in self.processes.items()}
        raw["rabbitmq"] = {"url": RABBITMQ_URL, "started_by_us": self.rabbitmq_started_by_us}
        _write_atomically(Path(state_dir) / STATE_FILE, json.dumps(raw, indent=2) + "\n")


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render_env(kafka_bootstrap: str, mongo_uri: str, rabbitmq_url: str) -> str:
    return (
        f"MSGBUS_MONGO_URI={mongo_uri}\n"
        f"MSGBUS_KAFKA_BOOTSTRAP={kafka_bootstrap}\n"
        f"MSGBUS_RABBITMQ_URL={rabbitmq_url}\n"
        # SecantusDB scans the whole collection for an index walk (msgbus/store/skipscan.py)
        "MSGBUS_MONGO_INDEX_SKIP_SCANS=false\n"
    )


def _start_or_reuse(
    state: StackState, name: str, port: int, start: Callable[[], Running], started: list[Running]
) -> ProcessRecord:
    record = state.processes.get(name)
    if record is not None and record.runs(name):
        if record.port != port:
            raise ServiceError(
                f"{name} already runs on port {record.port} (pid {record.pid}): "
                f"run `msgbus services down` first to move it to port {port}"
            )
        say(f"{name} already running on {HOST}:{port} (pid {record.pid})")
        return record
    started.append(start())
    return ProcessRecord.of(started[-1])


def up(
    state_dir: Path = DEFAULT_STATE_DIR, kafka_port: int = 19092, mongo_port: int = 27027
) -> list[ServiceState]:
    """Start (or reuse) tansu and SecantusDB, ensure RabbitMQ; write services.json and .env."""
    state_dir = Path(state_dir)
    logs = state_dir / "logs"
    state = StackState.load(state_dir)
    started: list[Running] = []
    try:
        state.processes["tansu"] = _start_or_reuse(
            state,
            "tansu",
            kafka_port,
            lambda: start_tansu(kafka_port, logs, die_with_parent=False),
            started,
        )
        state.processes["secantus"] = _start_or_reuse(
            state,
            "secantus",
            mongo_port,
            lambda: start_secantus(
                mongo_port, state_dir / "mongo-data", logs, die_with_parent=False
            ),
            started,
        )
        state.rabbitmq_started_by_us |= ensure_rabbitmq().started_by_us
    except BaseException:
        for running in started:  # leave nothing half-started behind
            running.stop()
        raise
    state.save(state_dir)
    env = render_env(state.processes["tansu"].url, state.processes["secantus"].url, RABBITMQ_URL)
    _write_atomically(state_dir / ENV_FILE, env)
    return status(state_dir)


def down(state_dir: Path = DEFAULT_STATE_DIR, timeout_s: float = 15.0) -> list[str]:
    """Stop what `up` started (by the PIDs in services.json); returns the names stopped."""
    state = StackState.load(state_dir)
    stopped = []
    for name, record in state.processes.items():
        if record.runs(name):
            say(f"stopping {name} (pid {record.pid})")
            stop(record.pid, timeout_s)
            stopped.append(name)
    if state.rabbitmq_started_by_us and amqp_ready():
        stop_rabbitmq()
        stopped.append("rabbitmq")
    for name in (STATE_FILE, ENV_FILE):
        (Path(state_dir) / name).unlink(missing_ok=True)
    return stopped


def status(state_dir: Path = DEFAULT_STATE_DIR) -> list[ServiceState]:
    """Each service of the dev stack: up or down, with its address."""
    state = StackState.load(state_dir)
    states = []
    for name in MANAGED:
        record = state.processes.get(name)
        if record is None:
            states.append(ServiceState(name, "-", up=False))
            continue
        alive = record.runs(name) and port_accepts(HOST, record.port)
        states.append(ServiceState(name, record.url, alive, record.pid, record.log))
    states.append(ServiceState("rabbitmq", RABBITMQ_URL, amqp_ready()))
    return states
