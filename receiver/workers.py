"""`msgbus receiver --workers N`: N receiver processes serving one port.

The parent runs no receiver itself. It starts N children (`msgbus receiver --reuse-port`), each
listening on the same host:port with SO_REUSEPORT, so the kernel spreads connections over them;
each child claims its own buffer slot under the shared buffer root (receiver/bufferslots.py). The
parent forwards SIGTERM/SIGINT to the children and waits for them, and restarts a child that
dies unexpectedly after a short backoff (longer while it keeps dying young). The parent holds a
bound, non-listening socket on the port the whole time: it resolves port 0 and keeps the port
for the children across restarts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import click

from msgbus.metrics import forget_process
from msgbus.processes import RestartBackoff, die_with_parent, stop_children
from msgbus.serving import reuse_port_socket

SHORT_LIFE_S = 10.0  # a child that dies younger than this backs off longer each time
MAX_SHORT_LIVES = 5  # ... and after this many in a row, the parent gives up
STOP_TIMEOUT_S = 30.0  # after SIGTERM, before SIGKILL


@dataclass
class Worker:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    restarts: RestartBackoff = field(default_factory=lambda: RestartBackoff(
        young_s=SHORT_LIFE_S, give_up_after=MAX_SHORT_LIVES))


class WorkerPool:
    """Keeps `count` copies of `command` running until stopped."""

    def __init__(self, command: list[str], count: int, env: dict[str, str]) -> None:
        self.command = command
        self.env = env
        self.workers = [Worker(i) for i in range(count)]
        self._stop_signal: int | None = None
        self._wake = threading.Event()

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT; returns the exit code for the parent."""
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._supervise()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w.process is not None]

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._stop_signal = signum
        self._wake.set()

    def _supervise(self) -> int:
        while self._stop_signal is None:
            now = time.monotonic()
            for worker in self.workers:
                if worker.process is None:
                    if now >= worker.restart_at:
                        self._start(worker)
                elif ((code := worker.process.poll()) is not None
                      and not self._schedule_restart(worker, code, now)):
                    return 1
            self._wake.wait(0.2)
            self._wake.clear()
        return 0

    def _start(self, worker: Worker) -> None:
        worker.process = subprocess.Popen(
            self.command, env=self.env, stdin=subprocess.DEVNULL,
            start_new_session=True,  # terminal signals reach the parent only; it forwards them
            preexec_fn=die_with_parent())
        worker.started_at = time.monotonic()
        click.echo(f"msgbus receiver: worker {worker.index} started (pid "
                   f"{worker.process.pid})", err=True)

    def _schedule_restart(self, worker: Worker, code: int, now: float) -> bool:
        """A worker died unexpectedly: plan its restart; False when it keeps dying young."""
        assert worker.process is not None
        lived_s = now - worker.started_at
        pid, worker.process = worker.process.pid, None
        forget_process(pid)
        wait_s = worker.restarts.after_exit(lived_s)
        if wait_s is None:
            click.echo(f"msgbus receiver: worker {worker.index} (pid {pid}) exited with code "
                       f"{code} {MAX_SHORT_LIVES} times in a row within {SHORT_LIFE_S:.0f} s "
                       "of starting; giving up", err=True)
            return False
        worker.restart_at = now + wait_s
        click.echo(f"msgbus receiver: worker {worker.index} (pid {pid}) exited with code {code} "
                   f"after {lived_s:.1f} s; restarting it in {wait_s:.1f} s", err=True)
        return True

    def _stop_all(self) -> None:
        first = signal.SIGINT if self._stop_signal == signal.SIGINT else signal.SIGTERM
        stop_children([w.process for w in self.workers if w.process], STOP_TIMEOUT_S, first)


def run_receiver_workers(state_dir: Path, count: int, host: str, port: int) -> int:
    """Serve the receiver from `count` processes on host:port; returns the exit code."""
    holder = reuse_port_socket(host, port)  # resolves port 0; bound, never listening
    try:
        port = int(holder.getsockname()[1])
        env = {**os.environ, "MSGBUS_RECEIVER_HOST": host, "MSGBUS_RECEIVER_PORT": str(port)}
        command = [sys.executable, "-m", "msgbus_cli", "receiver", "--state-dir", str(state_dir),
                   "--workers", "1", "--reuse-port"]
        pool = WorkerPool(command, count, env)
        click.echo(f"msgbus receiver: {count} workers on http://{host}:{port}", err=True)
        code = pool.run()
        click.echo("msgbus receiver: all workers stopped", err=True)
        return code
    finally:
        holder.close()
