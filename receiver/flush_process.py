"""The receiver's flush process: `FlushService` in a process of its own, beside the receiver
process that answers producers (`flusher="process"`, the default).

Why: publishing and recording cost more CPU per message than accepting one, and on a shared
event loop (and GIL) their batches delayed answers to producers by tens of milliseconds. In a
process of its own the flush work runs beside the receiver instead of between its requests.

How the two processes share a buffer slot:
- The receiver claims the slot (an flock on its lock file) and starts the flush process with
  that lock file's descriptor, so the slot stays locked while either process lives: no adopter
  takes a slot whose flush process is still at work.
- Both open the slot's LMDB environment. The receiver appends; the flush process reads and
  deletes. After each durable append the receiver writes a byte into a pipe (the "doorbell");
  the flush process wakes on it instead of polling.
- The receiver restarts a flush process that dies (a kill -9 loses nothing: entries are
  deleted only after the brokers and MongoDB took them).
- When the receiver dies, the doorbell pipe reaches EOF and the flush process exits at once:
  the slot is then free for the receiver's replacement, or for an adopter (receiver/adoption.py),
  as the slot of a receiver process that flushed inline would be.

The flush process's metrics reach the receiver's /metrics through prometheus_client's
multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by `msgbus receiver`). Its MongoDB gate (the
claims and records are its calls) is written to GATE_STATE_FILE in the slot whenever it opens
or closes, and the receiver's /health shows it.

    python -m receiver.flush_process --slot DIR --lock-fd N --doorbell-fd M  < pickled settings
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import pickle
import signal
import sys
from pathlib import Path
from typing import Any

import orjson

from msgbus import telemetry
from msgbus.gcfreeze import freeze_startup_objects
from msgbus.metrics import forget_process
from msgbus.processes import RestartBackoff, stop_child
from msgbus.registry import Registry
from msgbus.settings import ReceiverSettings, TracingSettings
from msgbus.store import MongoStore
from msgbus.tasks import cancel_and_wait
from receiver.bufferslots import ClaimedSlot
from receiver.flushing import FlushService, open_buffer

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
GATE_STATE_FILE = "flush-mongo-gate.json"


def write_gate_state(path: Path, state: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_bytes(orjson.dumps(state))
    partial.replace(path)


def read_gate_state(path: Path) -> dict[str, Any] | None:
    """The flush process's MongoDB gate as it last wrote it; None before it did."""
    try:
        state: dict[str, Any] = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return state


class FlushProcess:
    """The receiver's side: starts the flush process for its slot, rings its doorbell, restarts
    it when it dies, and stops it."""

    def __init__(self, settings: ReceiverSettings, slot: ClaimedSlot) -> None:
        self._settings = settings
        self._slot = slot
        self._process: asyncio.subprocess.Process | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._bell_read, self._bell_write = os.pipe()  # both ends close-on-exec
        os.set_blocking(self._bell_write, False)
        self.restarts = 0

    def mongo_gate(self) -> dict[str, Any] | None:
        """The flush process's MongoDB gate, as it last wrote it."""
        return read_gate_state(self._slot.path / GATE_STATE_FILE)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process and self._process.returncode is None else None

    def ring(self) -> None:
        """Tell the flush process that entries were appended (never blocks)."""
        with contextlib.suppress(BlockingIOError):  # a full pipe already holds a wake-up
            os.write(self._bell_write, b"\x00")

    async def start(self) -> None:
        await self._spawn()
        self._monitor = asyncio.create_task(self._supervise(), name="flush-process")

    async def _spawn(self) -> None:
        lock_fd = self._slot.fileno()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "receiver.flush_process", "--slot", str(self._slot.path),
            "--lock-fd", str(lock_fd), "--doorbell-fd", str(self._bell_read),
            stdin=asyncio.subprocess.PIPE, pass_fds=(lock_fd, self._bell_read))
        assert process.stdin is not None
        process.stdin.write(pickle.dumps(self._settings))  # settings hold secrets: not argv/env
        await process.stdin.drain()
        process.stdin.close()
        self._process = process
        log.info("receiver flush process started (pid %d) for %s", process.pid,
                 self._slot.path)

    async def _supervise(self) -> None:
        # a flush process that lived 100 s (ten times the longest wait) starts the waits over
        restarts = RestartBackoff(first_s=0.5, max_s=10.0, young_s=100.0)
        loop = asyncio.get_running_loop()
        while True:
            assert self._process is not None
            started = loop.time()
            code = await self._process.wait()
            forget_process(self._process.pid)
            wait_s = restarts.after_exit(loop.time() - started)
            assert wait_s is not None  # it never gives up: the receiver needs its flush
            log.error("receiver flush process (pid %d) exited with code %s; restarting it in "
                      "%.1f s", self._process.pid, code, wait_s)
            await asyncio.sleep(wait_s)
            try:
                await self._spawn()
            except OSError as exc:
                log.error("starting the receiver flush process failed: %s", exc)
            self.restarts += 1
            self.ring()  # whatever arrived meanwhile

    async def close(self) -> None:
        """Stop the flush process (SIGTERM, then SIGKILL after STOP_TIMEOUT_S)."""
        await cancel_and_wait(self._monitor)
        if self._process is not None:
            await stop_child(self._process, STOP_TIMEOUT_S)
            forget_process(self._process.pid)
        for fd in (self._bell_read, self._bell_write):
            with contextlib.suppress(OSError):
                os.close(fd)


# --- the flush process ------------------------------------------------------------------


async def _flush(settings: ReceiverSettings, slot: ClaimedSlot, doorbell_fd: int) -> None:
    conn = settings.connections
    store = MongoStore(conn.mongo_uri, conn.mongo_db, component="receiver-flush")
    store.gate.on_change = functools.partial(write_gate_state, slot.path / GATE_STATE_FILE)
    write_gate_state(slot.path / GATE_STATE_FILE, store.gate.state())
    registry = Registry(store, refresh_s=conn.config_refresh_s)
    buffer = open_buffer(settings, slot.path)
    service = FlushService(settings, store, registry, buffer, slot.root)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_doorbell() -> None:
        try:
            rung = os.read(doorbell_fd, 4096)
        except BlockingIOError:
            return
        if rung:
            buffer.notify_appended()
            return
        # EOF: the receiver process is gone. Exit at once, as if killed, so that its slot is
        # free for the next receiver at once: every sink is idempotent and nothing was deleted
        # from the buffer that a broker or MongoDB had not taken.
        log.warning("the receiver of %s is gone; the flush process exits", slot.path)
        os._exit(0)

    os.set_blocking(doorbell_fd, False)
    loop.add_reader(doorbell_fd, on_doorbell)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await registry.start()
        await service.start()
        freeze_startup_objects()
        await stop.wait()
    finally:
        await service.close()
        await registry.close()
        await store.close()
        buffer.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m receiver.flush_process")
    parser.add_argument("--slot", type=Path, required=True)
    parser.add_argument("--lock-fd", type=int, required=True)
    parser.add_argument("--doorbell-fd", type=int, required=True)
    args = parser.parse_args(argv)
    settings = pickle.load(sys.stdin.buffer)
    if not isinstance(settings, ReceiverSettings):
        parser.error("stdin must hold the receiver's pickled settings")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s [flush]: %(message)s")
    for noisy in ("pymongo", "httpx", "pika"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The lock is the receiver's: closing our descriptor on exit is enough (never truncate).
    slot = ClaimedSlot(args.slot, args.lock_fd)
    os.nice(settings.flush_nice)
    telemetry.configure(TracingSettings(), "msgbus-receiver")
    asyncio.run(_flush(settings, slot, args.doorbell_fd))


if __name__ == "__main__":
    main()
