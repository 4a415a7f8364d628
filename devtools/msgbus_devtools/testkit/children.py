"""Short Python scripts run as child processes (`python -c SCRIPT ARGS...`) that stand for a
pod or a producer on a node: what a child prints before its "ready" line is its report, and it
ends as a node would end it, with kill -9.

- `ScriptChild`: one such child, started and read up to "ready".
- `ScriptChildren`: the children of one test, all killed at its end (a context manager).
- `SPOOLING_PRODUCER`: a producer whose receiver is unreachable, so its messages stay spooled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[3]
READY = "ready"

# A producer pod whose receiver is unreachable: it spools COUNT messages (biz_id "left-N"),
# prints their ids, and waits to be killed, like a pod that lost its network and then its node.
# Arguments: receiver URL, API key, spool dir, destination, COUNT.
SPOOLING_PRODUCER = textwrap.dedent(
    """
    import sys, time
    from msgbus_client import MsgbusClient
    url, key, spool_dir, destination, count = sys.argv[1:]
    client = MsgbusClient(url, key, spool_dir=spool_dir, retry_base_s=30)
    for n in range(int(count)):
        print(client.send(destination, {"n": n}, biz_id=f"left-{n}"), flush=True)
    print("ready", flush=True)
    time.sleep(120)
    """
)


class ScriptChild:
    """`python -c script *args` in the repository root; `lines` are the lines (stripped) it
    printed before "ready" (all of them if it exited without saying "ready")."""

    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        for line in self.proc.stdout:
            if line.strip() == READY:
                break
            self.lines.append(line.strip())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """kill -9 unless it has exited; reaps it either way."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


class ScriptChildren:
    """Starts `ScriptChild`ren and kills every one of them on exit."""

    def __init__(self) -> None:
        self.started: list[ScriptChild] = []

    def start(self, script: str, *args: str) -> ScriptChild:
        child = ScriptChild(script, *args)
        self.started.append(child)
        return child

    def __enter__(self) -> ScriptChildren:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for child in self.started:
            child.kill()
