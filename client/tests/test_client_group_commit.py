"""Group commit: concurrent senders share spool commits; every message arrives once."""

from __future__ import annotations

import threading
from collections.abc import Callable

from client_testkit import StubReceiver, eventually, free_port

from msgbus_client import MsgbusClient, SpoolFullError

MakeClient = Callable[..., MsgbusClient]

THREADS = 8
PER_THREAD = 25


def _send_from_threads(client: MsgbusClient) -> list[str]:
    ids: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def work(worker: int) -> None:
        barrier.wait()
        for n in range(PER_THREAD):
            message_id = client.send("orders", {"worker": worker, "n": n})
            with lock:
                ids.append(message_id)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return ids


def test_many_threads_share_commits_and_all_messages_arrive_once(
    receiver: StubReceiver, make_client: MakeClient
) -> None:
    client = make_client(receiver.url, group_commit_ms=2)
    ids = _send_from_threads(client)
    total = THREADS * PER_THREAD
    assert len(set(ids)) == total
    commits = client.spool.stats().commits
    # every send() returned after its durable commit, and groups shared commits (the
    # resender's settles come on top; per-message mode would need at least `total`)
    assert commits < total
    # the resender delivers the groups in batches, each message once
    eventually(lambda: sorted(receiver.ids()) == sorted(ids))
    eventually(lambda: client.spool.pending_count() == 0)
    assert any(a.endpoint == "batch" for a in receiver.attempts)
    bodies = {(r.doc["body"]["worker"], r.doc["body"]["n"]) for r in receiver.received}
    assert len(bodies) == total


def test_group_commit_while_receiver_down(make_client: MakeClient) -> None:
    down = StubReceiver(port=free_port())
    client = make_client(down.url, group_commit_ms=2)
    ids = _send_from_threads(client)
    assert client.spool.pending_count() == THREADS * PER_THREAD
    down.start()
    try:
        eventually(lambda: sorted(down.ids()) == sorted(ids))
        eventually(lambda: client.spool.pending_count() == 0)
    finally:
        down.stop()


def test_group_commit_spool_full_fails_only_what_does_not_fit(make_client: MakeClient) -> None:
    client = make_client(f"http://127.0.0.1:{free_port()}", group_commit_ms=2, max_spool_bytes=3000)
    sent, full = [], 0
    for n in range(60):
        try:
            sent.append(client.send("orders", {"n": n, "pad": "y" * 100}))
        except SpoolFullError:
            full += 1
    assert sent and full
    assert client.spool.pending_count() == len(sent)
