"""The processes the benchmark stacks (bench/dispatch_stack.py, bench/ingest_stack.py and the
benchmarks that start processes of their own) start: stopping them, and their CPU time.

Both stacks import this module, and neither imports the other."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench.report import say
from msgbus import processes

STOP_TIMEOUT_S = 30.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def stop_process(process: subprocess.Popen[bytes], name: str) -> None:
    """SIGTERM a process we started, SIGKILL it if it lingers."""
    if process.poll() is not None:
        return
    say(f"stopping {name} (pid {process.pid})")
    processes.stop_process(process, STOP_TIMEOUT_S)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # exited meanwhile


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process, its live descendants (the receiver's worker and flush
    processes) and the children they have reaped."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        if (fields := _stat_fields(current)) is not None:
            total += sum(int(f) for f in fields[11:15]) / _CLOCK_TICKS  # u, s, cu, cs
        todo += children.get(current, [])
    return total
