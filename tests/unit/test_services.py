"""msgbus_devtools.servers without real servers: ports, waiting, stopping by PID, the dev-stack
files."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from msgbus_devtools import servers as services
from msgbus_devtools import stack as devstack
from msgbus_devtools.cli import services as services_cli

from msgbus import processes
from msgbus.errors import Unavailable


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def python_process(code: str, **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], **kwargs)  # type: ignore[call-overload]


def test_free_port_is_free_and_a_listening_port_is_not(listening_port: int) -> None:
    assert services.port_is_free(services.free_port())
    assert not services.port_is_free(listening_port)


def test_wait_for_port_returns_once_the_port_accepts(listening_port: int) -> None:
    services.wait_for_port("127.0.0.1", listening_port, timeout_s=5)


def test_wait_for_port_raises_a_service_error_on_timeout() -> None:
    port = services.free_port()
    with pytest.raises(services.ServiceError, match=f"127.0.0.1:{port} not ready"):
        services.wait_for_port("127.0.0.1", port, timeout_s=0.3)


def test_a_process_that_dies_early_is_reported_with_its_log(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    code = "import sys; print('cannot bind: boom', flush=True); sys.exit(3)"
    with open(log_path, "wb") as log:
        process = python_process(code, stdout=log, stderr=subprocess.STDOUT)
    with pytest.raises(services.ServiceError) as caught:
        services.wait_ready("fake server", lambda: False, 30, process, log_path)
    assert "exited with code 3" in caught.value.message
    assert str(log_path) in caught.value.message
    assert "cannot bind: boom" in caught.value.message


def test_service_error_is_an_unavailable() -> None:
    assert issubclass(services.ServiceError, Unavailable)


def test_starting_on_a_busy_port_fails_clearly(listening_port: int, tmp_path: Path) -> None:
    with pytest.raises(services.ServiceError, match="already in use"):
        services.start_tansu(listening_port, tmp_path)
    with pytest.raises(services.ServiceError, match="already in use"):
        services.start_secantus(listening_port, tmp_path / "data", tmp_path)


def test_stop_terminates_a_process() -> None:
    process = python_process("import time; time.sleep(60)")
    assert processes.pid_runs(process.pid, "time.sleep(60)")
    assert services.stop(process.pid, timeout_s=5)
    assert not processes.pid_alive(process.pid)
    assert not services.stop(process.pid)


def test_stop_kills_a_process_that_ignores_sigterm() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True)"
    )
    process = python_process(code + "; time.sleep(60)", stdout=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.readline()  # SIGTERM is ignored from here on
    assert services.stop(process.pid, timeout_s=0.3)
    assert not processes.pid_alive(process.pid)


def test_pid_runs_checks_the_command_line() -> None:
    process = python_process("import time; time.sleep(60)")
    try:
        assert not processes.pid_runs(process.pid, "secantusd-py")
    finally:
        services.stop(process.pid)


def test_amqp_ready_is_false_without_a_server() -> None:
    assert not services.amqp_ready(port=services.free_port())


def test_render_env_names_every_address() -> None:
    env = devstack.render_env("127.0.0.1:1", "mongodb://127.0.0.1:2", "amqp://x")
    assert env.splitlines() == [
        "MSGBUS_MONGO_URI=mongodb://127.0.0.1:2",
        "MSGBUS_KAFKA_BOOTSTRAP=127.0.0.1:1",
        "MSGBUS_RABBITMQ_URL=amqp://x",
        "MSGBUS_MONGO_INDEX_SKIP_SCANS=false",
    ]


def test_status_of_an_empty_state_dir_reports_both_servers_down(tmp_path: Path) -> None:
    states = {state.name: state for state in devstack.status(tmp_path)}
    assert not states["tansu"].up
    assert not states["secantus"].up
    assert devstack.down(tmp_path) == []


def test_cli_status_exits_1_when_a_server_is_down(tmp_path: Path) -> None:
    result = CliRunner().invoke(services_cli, ["status", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "tansu     DOWN" in result.output


def test_cli_up_on_a_busy_port_fails_with_the_reason(listening_port: int, tmp_path: Path) -> None:
    args = ["up", "--state-dir", str(tmp_path), "--kafka-port", str(listening_port)]
    result = CliRunner().invoke(services_cli, args)
    assert result.exit_code == 1
    assert "already in use" in result.output


def test_as_flags_spells_options_as_command_line_flags() -> None:
    assert services.as_flags(storage_path=Path("/d"), port=1) == [
        "--storage-path",
        "/d",
        "--port",
        "1",
    ]
