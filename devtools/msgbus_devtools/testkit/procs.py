"""Bus services and backing servers as separate OS processes that a test can kill and restart.

- `BusProcess`: `python -m msgbus_cli receiver|dispatcher` with MSGBUS_* variables; started
  and waited for on /health, stopped (SIGTERM) or killed (-9), restarted with the same
  environment (so the same state and buffer directories). Its output goes to a log file
  under the test's tmp_path; `tail()` shows the end of it.
- `ServerSlot`: a backing server (`msgbus_devtools.servers.Running`: SecantusDB, tansu, moto) that
  the test stops and starts again on the same port and storage.
- `RabbitNode`: a private RabbitMQ node (own port, node name, Mnesia and log directories), so
  an outage never touches the machine's shared RabbitMQ.

Both `pause()` (SIGSTOP) and `resume()` (SIGCONT) a server: a hung server, whose connections
stay open and whose listen backlog still takes connections, but which answers no byte.

Every process is started by this process and stopped by its PID (a RabbitMQ node by its
process group, which its start script leads).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from msgbus import processes
from msgbus_devtools import servers as services
from msgbus_devtools.servers import HOST, Running, ServiceError
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import eventually

REPO = Path(__file__).resolve().parents[3]  # the repository root
RABBITMQ_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # runs as the calling user


def say(message: str) -> None:
    print(f"[procs {time.strftime('%H:%M:%S')}] {message}", flush=True)


def timed(action: Callable[[], object]) -> float:
    """Run `action`; the seconds it took."""
    began = time.monotonic()
    action()
    return time.monotonic() - began


def process_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R, S, T for stopped, ...); "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]  # after "(comm)", which may hold spaces


def freeze(pid: int, name: str) -> None:
    """SIGSTOP `pid`, returning once the kernel reports every thread of it stopped."""
    os.kill(pid, signal.SIGSTOP)
    eventually(lambda: process_state(pid) == "T", 5, f"{name} (pid {pid}) to stop",
               interval_s=0.1)
    say(f"{name} (pid {pid}) paused (SIGSTOP)")


def thaw(pid: int, name: str) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    say(f"{name} (pid {pid}) resumed (SIGCONT)")


def tail(log_path: Path, lines: int = 40) -> str:
    if not log_path.is_file():
        return f"(no log at {log_path})"
    text = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- last {len(text)} lines of {log_path} ---\n" + "\n".join(text)


# ---- msgbus services ---------------------------------------------------------------------------


class BusProcess:
    """One msgbus service (`receiver`, `dispatcher`, ...) in its own OS process."""

    def __init__(self, service: str, name: str, port: int, env: dict[str, str],
                 log_dir: Path) -> None:
        self.service = service
        self.name = name
        self.port = port
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._launched_at = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, timeout_s: float = 60.0) -> float:
        """Start and wait until /health answers 200; returns the seconds that took."""
        self.launch()
        return self.wait_started(timeout_s)

    def launch(self) -> None:
        """Start without waiting (`wait_started` waits): several processes start together."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"{self.name} is already running (pid {self.process.pid})")
        self.starts += 1
        with open(self.log_path, "a") as log:
            log.write(f"\n===== start #{self.starts} of {self.name} at {time.ctime()} =====\n")
        self._launched_at = time.monotonic()
        self.process = self._spawn()

    def wait_started(self, timeout_s: float = 60.0) -> float:
        """Until the launched process's /health answers 200; the seconds since its launch."""
        assert self.process is not None, f"{self.name} was not launched"
        began = self._launched_at
        try:
            services.wait_ready(f"{self.name} /health", self.healthy, timeout_s, self.process,
                                self.log_path)
        except BaseException:
            self.kill9()
            raise
        took = time.monotonic() - began
        say(f"{self.name} (pid {self.process.pid}) healthy on {self.url} after {took:.1f} s")
        return took

    def _spawn(self) -> subprocess.Popen[bytes]:
        """The service with exactly our MSGBUS_* variables (none inherited from the shell)."""
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "msgbus_cli", self.service], cwd=REPO,
                env=service_env(self.env), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=processes.die_with_parent())  # dies with the test

    def health(self, timeout_s: float = 10.0) -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{self.url}/health", timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return dict(response.json()) if response.status_code == 200 else None

    def healthy(self) -> bool:
        return self.health(timeout_s=2.0) is not None

    def metrics(self, prefix: str) -> list[str]:
        """The /metrics lines (no comments) whose metric name starts with `prefix`."""
        try:
            text = httpx.get(f"{self.url}/metrics", timeout=10).text
        except httpx.HTTPError as exc:
            return [f"(no metrics: {exc})"]
        return [line for line in text.splitlines() if line.startswith(prefix)]

    def metric_sum(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` (a counter's with its `_total`) whose labels
        include `labels`; 0.0 if there are none."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples
                   if sample.name == name and labels.items() <= sample.labels.items())

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
            say(f"{self.name} (pid {self.process.pid}) killed with SIGKILL")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (a graceful shutdown), SIGKILL after `timeout_s`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            say(f"{self.name} ignored SIGTERM for {timeout_s:.0f} s; killing it")
            self.kill9()

    def tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)


# ---- backing servers ---------------------------------------------------------------------------


class ServerSlot:
    """A backing server the test stops and starts again on the same port and storage."""

    def __init__(self, running: Running) -> None:
        self.name = running.name
        self.running = running
        self.up = True
        self.paused = False
        self.log_path = running.log_path

    @property
    def url(self) -> str:
        return self.running.url

    def _report(self, up: bool, what: str, took: float) -> float:
        self.up = up
        say(f"{self.name} on port {self.running.port} {what} {took:.1f} s")
        return took

    def stop(self) -> float:
        self.resume()  # a stopped process would hold SIGTERM until then
        return self._report(False, "stopped in", timed(self.running.stop))

    def pause(self) -> None:
        """SIGSTOP: the server hangs (see the module docstring) until `resume()`."""
        freeze(self.running.pid, self.name)
        self.paused = True

    def resume(self) -> None:
        if self.paused:
            thaw(self.running.pid, self.name)
            self.paused = False

    def kill9(self) -> float:
        """SIGKILL: a crash, and a quick stop for a server slow to shut down gracefully."""

        def kill() -> None:
            if self.running.process is not None and self.running.process.poll() is None:
                self.running.process.kill()
                self.running.process.wait(30)
            else:
                self.running.stop()

        return self._report(False, "killed (-9) in", timed(kill))

    def start(self) -> float:
        if self.up:
            return 0.0
        starter = self.running.starter
        if starter is None:
            raise ServiceError(f"{self.name} cannot be restarted")

        def restart() -> None:
            self.running = starter()

        return self._report(True, "back after", timed(restart))

    def close(self) -> None:
        if self.up:
            self.running.stop()
            self.up = False


class RabbitNode:
    """A private RabbitMQ node on its own port, whose data survive a stop and start."""

    def __init__(self, base_dir: Path) -> None:
        self.name = "rabbitmq"
        self.port = services.free_port()
        self.dist_port = services.free_port()
        self.node = f"msgbus-test-{self.port}@localhost"
        self.base_dir = base_dir
        self.log_path = base_dir / "rabbitmq-server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.up = False
        self.paused_pid: int | None = None
        for sub in ("home", "mnesia", "log"):
            (base_dir / sub).mkdir(parents=True, exist_ok=True)
        (base_dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {HOST}:{self.port}\n")
        (base_dir / "enabled_plugins").write_text("[].\n")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/%2F"

    def _env(self) -> dict[str, str]:
        base = self.base_dir
        return {
            "HOME": str(base / "home"),  # its own Erlang cookie, never the user's
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),  # + ".conf"
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "node.pid"),
        }

    def launch(self) -> None:
        """Start the node without waiting (see `wait_ready`)."""
        script = RABBITMQ_SCRIPT if RABBITMQ_SCRIPT.is_file() else None
        found = script or shutil.which("rabbitmq-server")
        if found is None:
            raise ServiceError("rabbitmq-server is not installed")
        self.process = services.spawn(f"RabbitMQ node {self.node}", [str(found)],
                                      self.log_path, die_with_parent=True, env=self._env())

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        services.wait_ready(f"RabbitMQ node on {HOST}:{self.port}",
                            lambda: services.amqp_ready(port=self.port), timeout_s,
                            self.process, self.base_dir / "log")
        self.up = True

    def start(self) -> float:
        if self.up:
            return 0.0
        began = time.monotonic()
        self.launch()
        self.wait_ready()
        took = time.monotonic() - began
        say(f"RabbitMQ node {self.node} up after {took:.1f} s")
        return took

    def vm_pid(self) -> int:
        """The Erlang VM's pid (beam.smp), which the node writes to its pid file. Not the start
        script's: it runs the VM as a child, and stopping the script freezes nothing."""
        pid_file = self.base_dir / "node.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise ServiceError(f"RabbitMQ node {self.node}: no pid in {pid_file}: {exc}") from exc
        comm = Path(f"/proc/{pid}/comm").read_text().strip() if process_state(pid) else ""
        if comm != "beam.smp":
            raise ServiceError(f"RabbitMQ node {self.node}: pid {pid} of {pid_file} is "
                               f"{comm or 'gone'}, not beam.smp")
        return pid

    def pause(self) -> None:
        """SIGSTOP to the Erlang VM: the node hangs until `resume()`."""
        pid = self.vm_pid()
        freeze(pid, f"RabbitMQ node {self.node}")
        self.paused_pid = pid

    def resume(self) -> None:
        pid, self.paused_pid = self.paused_pid, None
        if pid is not None:
            thaw(pid, f"RabbitMQ node {self.node}")

    def stop(self, timeout_s: float = 30.0) -> float:
        """SIGTERM to the start script (it stops the node cleanly); SIGKILL to the process
        group it leads after `timeout_s`."""
        began = time.monotonic()
        self.resume()
        process = self._detach()
        if process is None:
            return 0.0
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            say(f"RabbitMQ node {self.node} ignored SIGTERM; killing its process group")
            self._kill_group(process)
        return self._closed(began, "stopped")

    def kill9(self) -> float:
        """SIGKILL to the process group the start script leads (the Erlang VM included)."""
        began = time.monotonic()
        process = self._detach()
        if process is None:
            return 0.0
        self._kill_group(process)
        return self._closed(began, "killed (-9)")

    def _detach(self) -> subprocess.Popen[bytes] | None:
        """The node's process, if it still runs; the node counts as down from now on."""
        process, self.process = self.process, None
        self.up = False
        return process if process is not None and process.poll() is None else None

    @staticmethod
    def _kill_group(process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

    def _closed(self, began: float, how: str) -> float:
        eventually(lambda: not services.port_accepts(HOST, self.port), 30,
                   f"port {self.port} to close", interval_s=0.1)
        took = time.monotonic() - began
        say(f"RabbitMQ node {self.node} {how} in {took:.1f} s")
        return took

    def close(self) -> None:
        self.kill9()
