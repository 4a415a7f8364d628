"""The four measurements of `python -m bench.client_send`, one function each; every one returns
a `Sample` (messages, seconds, and what else it saw) and reports progress to stderr.

- `raw_put_fsync`: the physical limit. An LMDB environment opened exactly like the client's spool
  (same flags, map size and named database), one write transaction (= one fsync) per put of a
  value as large as a spooled message, with 16-byte time-ordered keys like the spool's.
- `single_send`: `MsgbusClient.send()` from one thread, one commit per message.
- `group_send`: `send()` from N threads with group commit.
- `flush`: a client opened on a full spool against a live receiver; time until the spool is empty.

The two send() phases measure durable spooling only: `inline_send=False`, and a receiver URL
that refuses every connection (`DeadPort`), with a long retry backoff, so the resender makes one
refused attempt and then sleeps instead of competing for the spool.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
from msgbus_client import MsgbusClient
from msgbus_client.message import build_entry
from msgbus_client.spool import Spool
from msgbus_devtools.testkit.waiting import NotInTime, eventually

from bench.report import say

PROGRESS_EVERY_S = 2.0
# send() phases: the resender tries once, is refused, and then waits this long
SPOOL_ONLY = {"inline_send": False, "retry_base_s": 120.0, "retry_max_s": 120.0,
              "idle_poll_s": 120.0}


@dataclass
class Sample:
    phase: str
    run: int
    messages: int
    seconds: float
    commits: int = 0  # fsync'd spool transactions, where known
    settle_s: float = float("nan")  # flush: until MongoDB held them all, after the spool emptied
    problems: list[str] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else float("nan")


class Progress:
    """Prints `label: done/total` to stderr at most every PROGRESS_EVERY_S."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = total
        self.began = time.monotonic()
        self._next = self.began + PROGRESS_EVERY_S

    def tick(self, done: int, extra: str = "") -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + PROGRESS_EVERY_S
            rate = done / (now - self.began) if now > self.began else 0.0
            say(f"{self.label}: {done}/{self.total} ({rate:.0f}/s){extra}")


def message(i: int, pad: str) -> dict[str, Any]:
    return {"n": i, "item": "book", "pad": pad}


def biz_id(i: int) -> str:
    return f"order-{i % 50}"


def spooled_value_size(destination: str, pad: str) -> int:
    """Bytes of the LMDB value the spool writes for one of our messages."""
    entry = build_entry(destination, message(10**9, pad), biz_id=biz_id(10**9))
    return len(entry.to_value())


def spool_env_options(probe_dir: Path) -> dict[str, Any]:
    """lmdb.open() options equal to those of the client's spool, read from a real Spool's
    environment (so a change in spool.py shows up here), or the documented ones."""
    spool = Spool(probe_dir)
    try:
        env = getattr(spool, "_env", None)
        if not isinstance(env, lmdb.Environment):
            return {"sync": True, "metasync": True, "readahead": False, "max_dbs": 4,
                    "map_size": 2 * spool.max_bytes + 32 * 1024 * 1024}
        return {**env.flags(), "max_dbs": 4, "map_size": env.info()["map_size"]}
    finally:
        spool.close()


def raw_put_fsync(directory: Path, count: int, value_size: int, options: dict[str, Any],
                  run: int) -> Sample:
    directory.mkdir(parents=True)
    env = lmdb.open(str(directory), **options)
    try:
        db = env.open_db(b"pending")
        value = os.urandom(value_size)
        prefix = uuid.uuid4().bytes[:8]
        keys = [prefix + i.to_bytes(8, "big") for i in range(count)]  # ordered, like UUIDv7
        progress = Progress(f"run {run} raw put+fsync", count)
        began = time.perf_counter()
        for i, key in enumerate(keys):
            with env.begin(write=True) as txn:
                txn.put(key, value, db=db)
            if i & 63 == 63:
                progress.tick(i + 1)
        seconds = time.perf_counter() - began
        with env.begin() as txn:
            stored = txn.stat(db)["entries"]
    finally:
        env.close()
    problems = [] if stored == count else [f"{count - stored} puts missing"]
    return Sample("raw", run, count, seconds, commits=count, problems=problems)


def _close_full(client: MsgbusClient, expected: int) -> list[str]:
    left = client.close(0.0)
    return [] if left == expected else [f"{left} of {expected} messages left in the spool"]


def single_send(directory: Path, dead_url: str, api_key: str, destination: str, count: int,
                pad: str, run: int) -> Sample:
    client = MsgbusClient(dead_url, api_key, spool_dir=directory, **SPOOL_ONLY)
    progress = Progress(f"run {run} send() 1 thread", count)
    began = time.perf_counter()
    for i in range(count):
        client.send(destination, message(i, pad), biz_id=biz_id(i))
        if i & 63 == 63:
            progress.tick(i + 1)
    seconds = time.perf_counter() - began
    commits = client.spool.stats().commits
    return Sample("single", run, count, seconds, commits=commits,
                  problems=_close_full(client, count))


def group_send(directory: Path, dead_url: str, api_key: str, destination: str, count: int,
               pad: str, run: int, threads: int, group_commit_ms: float) -> Sample:
    """`threads` threads send count/threads messages each; time from the first send() call to
    the last send() return."""
    client = MsgbusClient(dead_url, api_key, spool_dir=directory,
                          group_commit_ms=group_commit_ms, **SPOOL_ONLY)
    shares = [count // threads + (1 if t < count % threads else 0) for t in range(threads)]
    done = [0] * threads
    spans: list[tuple[float, float]] = []
    errors: list[str] = []
    gate = threading.Barrier(threads)

    def work(t: int) -> None:
        first = sum(shares[:t])
        gate.wait()
        began = time.perf_counter()
        try:
            for i in range(first, first + shares[t]):
                client.send(destination, message(i, pad), biz_id=biz_id(i))
                done[t] += 1
        except Exception as exc:  # reported, not raised: the other threads go on
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")
        spans.append((began, time.perf_counter()))

    workers = [threading.Thread(target=work, args=(t,), name=f"bench-send-{t}")
               for t in range(threads)]
    progress = Progress(f"run {run} send() {threads} threads, group commit", count)
    for worker in workers:
        worker.start()
    for worker in workers:
        while worker.is_alive():
            worker.join(0.25)
            progress.tick(sum(done))
    seconds = max(end for _, end in spans) - min(start for start, _ in spans)
    commits = client.spool.stats().commits
    sent = sum(done)
    return Sample("group", run, sent, seconds, commits=commits,
                  problems=errors + _close_full(client, sent))


def flush(directory: Path, receiver_url: str, api_key: str, expected: int, run: int,
          timeout_s: float) -> Sample:
    """Open a client on a spool holding `expected` messages, with the receiver up; time until
    the spool is empty (polled every 20 ms)."""
    began = time.perf_counter()
    client = MsgbusClient(receiver_url, api_key, spool_dir=directory)
    progress = Progress(f"run {run} flush to the receiver", expected)
    problems: list[str] = []
    pending = expected

    def flushed() -> bool:
        nonlocal pending
        pending = client.spool.pending_count()
        progress.tick(expected - pending)
        return pending == 0

    try:
        eventually(flushed, timeout_s, f"run {run}: the spool empty", interval_s=0.02)
    except NotInTime:
        problems.append(f"{pending} messages still spooled after {timeout_s:.0f} s")
    seconds = time.perf_counter() - began
    rejected = client.spool.rejected_count()
    if rejected:
        problems.append(f"{rejected} messages rejected by the receiver")
    left = client.close(5.0)
    if left and not problems:
        problems.append(f"{left} messages left in the spool")
    return Sample("flush", run, expected - left - rejected, seconds, problems=problems)
