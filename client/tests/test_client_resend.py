"""The resender: what stays in the spool goes out later, oldest first, with backoff."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from client_testkit import API_KEY, StubReceiver, eventually, free_port

from msgbus_client import MsgbusClient

MakeClient = Callable[..., MsgbusClient]


def test_receiver_down_then_up_delivers_everything_in_batches(make_client: MakeClient) -> None:
    down = StubReceiver(port=free_port())  # nothing listens on this port yet
    client = make_client(down.url, max_batch_messages=4)
    started = time.monotonic()
    ids = [client.send("orders", {"n": n}, biz_id=f"o-{n}") for n in range(10)]
    assert time.monotonic() - started < 5  # send() neither raised nor hung
    assert client.spool.pending_count() == 10

    down.start()
    try:
        eventually(lambda: len(down.received) == 10)
        eventually(lambda: client.spool.pending_count() == 0)
        assert sorted(down.ids()) == ids
        assert down.ids() == ids  # oldest first
        assert {r.destination for r in down.received} == {"orders"}
        assert [r.doc["body"] for r in down.received] == [{"n": n} for n in range(10)]
        assert [r.doc["biz_id"] for r in down.received] == [f"o-{n}" for n in range(10)]
        batches = [a for a in down.attempts if a.endpoint == "batch"]
        assert batches and max(a.count for a in batches) == 4
    finally:
        down.stop()


def test_busy_receiver_retry_after_is_honoured(
    receiver: StubReceiver, make_client: MakeClient
) -> None:
    receiver.set_busy(503, retry_after="1")
    client = make_client(receiver.url)
    message_id = client.send("orders", {"n": 1})
    assert client.spool.pending_count() == 1
    eventually(lambda: len(receiver.attempts) >= 2)  # the resender tried again
    receiver.set_ready()
    eventually(lambda: receiver.ids() == [message_id])
    eventually(lambda: client.spool.pending_count() == 0)
    attempts = receiver.attempts
    gaps = [b.at - a.at for a, b in itertools.pairwise(attempts)]
    assert min(gaps) >= 0.9  # never sooner than Retry-After: 1


def test_429_is_retried_not_rejected(receiver: StubReceiver, make_client: MakeClient) -> None:
    receiver.set_busy(429, retry_after="0")
    client = make_client(receiver.url)
    message_id = client.send("orders", "x")
    eventually(lambda: len(receiver.attempts) >= 2)
    receiver.set_ready()
    eventually(lambda: receiver.ids() == [message_id])
    assert client.spool.rejected_count() == 0


def test_close_flushes_within_timeout(make_client: MakeClient) -> None:
    down = StubReceiver(port=free_port())
    client = make_client(down.url)
    for n in range(3):
        client.send("orders", n)
    down.start()
    try:
        assert client.close(timeout_s=5) == 0
        assert sorted(r.doc["body"] for r in down.received) == [0, 1, 2]
    finally:
        down.stop()


def test_close_leaves_undeliverable_messages_for_the_next_client(
    make_client: MakeClient, receiver: StubReceiver
) -> None:
    dead_url = f"http://127.0.0.1:{free_port()}"
    client = make_client(dead_url)
    ids = [client.send("orders", n) for n in range(3)]
    started = time.monotonic()
    assert client.close(timeout_s=0.3) == 3
    assert time.monotonic() - started < 3

    make_client(receiver.url)  # same spool_dir: picks them up on start
    eventually(lambda: sorted(receiver.ids()) == ids)


def test_message_survives_kill_9_right_after_send(
    spool_dir: Path, receiver: StubReceiver, make_client: MakeClient
) -> None:
    dead_url = f"http://127.0.0.1:{free_port()}"
    script = textwrap.dedent(
        f"""
        import sys, time
        from msgbus_client import MsgbusClient
        client = MsgbusClient({dead_url!r}, {API_KEY!r}, spool_dir={str(spool_dir)!r},
                              retry_base_s=30)
        print(client.send("orders", {{"important": True}}, biz_id="kill-9"), flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        message_id = proc.stdout.readline().strip()
        assert message_id, "the child did not send"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL

    client = make_client(receiver.url)  # the dir lock died with the child
    eventually(lambda: receiver.ids() == [message_id])
    [got] = receiver.received
    assert got.doc["body"] == {"important": True}
    assert got.doc["biz_id"] == "kill-9"
    eventually(lambda: client.spool.pending_count() == 0)


def test_inline_send_off_leaves_delivery_to_the_resender(
    receiver: StubReceiver, make_client: MakeClient
) -> None:
    client = make_client(receiver.url, inline_send=False, max_batch_messages=50)
    ids = [client.send("orders", n) for n in range(20)]
    eventually(lambda: sorted(receiver.ids()) == ids)
    eventually(lambda: client.spool.pending_count() == 0)
