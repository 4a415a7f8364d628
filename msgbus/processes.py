"""Child processes, one way everywhere: start one that dies with its parent, stop one (a grace
period after SIGTERM, then SIGKILL), and decide when to restart one that exited.

Used by `msgbus receiver --workers N` (receiver/workers.py), the receiver's flush process
(receiver/flush_process.py) and the development servers (devtools)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from msgbus.backoff import backoff_s

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM when its parent dies (Linux), or None
    where that cannot be had (not Linux, not the main thread: the kernel ties it to the thread
    that forks). `prctl` is looked up here: between fork and exec the child must not dlopen."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (an exited child of ours is reaped here; a zombie is dead)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def pid_runs(pid: int, command_fragment: str) -> bool:
    """True if `pid` is alive and (where /proc exists) its command line contains the fragment:
    a recorded pid may have been reused by another program since."""
    if not Path("/proc/self").exists():
        return pid_alive(pid)
    for _ in range(50):  # the command line reads empty while an exec is in progress
        if not pid_alive(pid):
            return False
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if cmdline:
                return command_fragment in cmdline.replace(b"\0", b" ").decode(errors="replace")
        time.sleep(0.01)
    return False


def stop_pid(pid: int, grace_s: float = 10.0, first: signal.Signals = signal.SIGTERM) -> bool:
    """`first` (SIGTERM) to `pid`, SIGKILL after `grace_s`; False if it was not running.
    Only for processes this program started."""
    if not pid_alive(pid):
        return False
    for sig in (first, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pid_alive(pid):
            return True
        log.warning("pid %d still alive %.0f s after %s", pid, grace_s, sig.name)
    raise RuntimeError(f"could not stop pid {pid}, not even with SIGKILL")


def stop_children(processes: list[subprocess.Popen[bytes]], grace_s: float,
                  first: signal.Signals = signal.SIGTERM) -> None:
    """Stop several children at once: `first` to each, then SIGKILL to those still running
    after `grace_s` (one grace period for all of them)."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        process.send_signal(first)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("pid %d did not stop within %.0f s; killing it", process.pid, grace_s)
            process.kill()
            process.wait()


def stop_process(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """One child: SIGTERM, SIGKILL after `grace_s`."""
    stop_children([process], grace_s)


async def stop_child(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """An asyncio child: SIGTERM, SIGKILL after `grace_s`."""
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace_s)
    except TimeoutError:
        log.warning("pid %d did not stop within %.0f s; killing it", process.pid, grace_s)
        process.kill()
        await process.wait()


@dataclass
class RestartBackoff:
    """When to restart a child that exited: soon the first time, longer each time it dies
    young again (a crash loop must not burn the machine), and not at all after `give_up_after`
    young deaths in a row (None: never give up)."""

    first_s: float = 0.5
    max_s: float = 10.0
    young_s: float = 10.0  # a child that lived less than this died young
    give_up_after: int | None = None
    young_deaths: int = 0

    def after_exit(self, lived_s: float) -> float | None:
        """The wait before the restart of a child that lived `lived_s`; None: give up."""
        if lived_s >= self.young_s:
            self.young_deaths = 0
            return self.first_s
        self.young_deaths += 1
        if self.give_up_after is not None and self.young_deaths >= self.give_up_after:
            return None
        return backoff_s(failures=self.young_deaths, first_s=self.first_s, max_s=self.max_s)
