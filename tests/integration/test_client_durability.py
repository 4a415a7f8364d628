"""The producer client's promises, checked against the real receiver (in-process bus on real
tansu, SecantusDB and RabbitMQ):

- a message whose send() returned survives a kill -9 of the producer: the next client on the
  same spool dir delivers it;
- after a receiver outage, everything spooled is delivered, in send order;
- what the receiver refuses as invalid (404 unknown destination, 413 too large) lands in the
  client's rejected list with the receiver's error, and the valid messages around it go through.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from msgbus_client import MsgbusClient
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.tcp_gate import TcpGate
from msgbus_devtools.testkit.waiting import eventually

from msgbus.settings import ReceiverSettings

REPO = Path(__file__).resolve().parents[2]
KILL_SENDS = 10_000
KILL_AFTER = (500, 2_000)  # SIGKILL once this many ids (a random number in range) are printed
OUTAGE_MESSAGES = 300
# short backoff so that delivery resumes soon after the gate opens (no timing is asserted)
QUICK_RETRY = {"retry_base_s": 0.1, "retry_max_s": 0.5}


def _stored_ids(bus: RunningBus, destination: str) -> list[str]:
    """Ids of every message of `destination` in MongoDB (one indexed query, no `$in`)."""

    async def fetch() -> list[str]:
        cursor = bus.store.db.messages.find({"destination": destination}, {"_id": 1})
        return [str(doc["_id"]) async for doc in cursor]

    return list(bus.query(fetch()))


def _first_arrivals(subscriber: RecordingSubscriber, wanted: set[str]) -> list[str]:
    """Message ids in the order the subscriber first received them (re-deliveries dropped)."""
    seen: set[str] = set()
    order = []
    for push in list(subscriber.pushes):
        message_id = push.message_id
        if message_id in wanted and message_id not in seen:
            seen.add(message_id)
            order.append(message_id)
    return order


def _assert_same_order(bus: RunningBus, sent: list[str], arrived: list[str]) -> None:
    assert len(arrived) == len(sent), f"{len(arrived)} of {len(sent)} messages arrived"
    for index, (want, got) in enumerate(zip(sent, arrived, strict=True)):
        if want != got:
            # where it went wrong: the receiver stamps received_at when it accepts a request
            stamps = {m: bus.query(bus.store.traces.get_message(m))["received_at"]
                      for m in (want, got)}
            pytest.fail(f"delivery order differs from send order at position {index}: expected "
                        f"message #{index} (received_at {stamps[want]}), got message "
                        f"#{sent.index(got)} (received_at {stamps[got]}); arrival order by send "
                        f"index: {[sent.index(a) for a in arrived]}")


def _gate_before(bus: RunningBus) -> TcpGate:
    """A closed gate in front of the receiver (start it with `with`)."""
    target = urlsplit(bus.receiver_url)
    assert target.hostname and target.port
    return TcpGate(target.hostname, target.port, open_=False)


# ---- kill -9 ---------------------------------------------------------------------------------


class _Lines:
    """Collects a child's stdout lines on a thread, so the test never blocks on a read."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.lines: list[str] = []
        self._stream = process.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line)

    def finish(self, timeout_s: float = 10) -> list[str]:
        self._thread.join(timeout_s)
        return list(self.lines)


def test_kill_9_during_sends_loses_no_message_whose_send_returned(
        bus: RunningBus, api_key: str, unique: str, tmp_path: Path) -> None:
    destination = f"kill9-{unique}"
    bus.create_destination(destination, "direct")  # no subscriber: the cheapest path
    spool = tmp_path / "spool"
    kill_after = random.randint(*KILL_AFTER)
    log = tmp_path / "producer.log"
    with open(log, "w") as stderr:
        producer = subprocess.Popen(
            [sys.executable, "-m", "msgbus_devtools.testkit.producer_proc", bus.receiver_url,
             str(spool), destination, str(KILL_SENDS)],
            cwd=REPO, env={**os.environ, "MSGBUS_API_KEY": api_key},
            stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        lines = _Lines(producer)
        eventually(lambda: len(lines.lines) >= kill_after or producer.poll() is not None, 120,
                   f"the producer to print {kill_after} message ids")
        producer.send_signal(signal.SIGKILL)
        producer.wait(10)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait(10)
    output = lines.finish()
    assert producer.returncode == -signal.SIGKILL, (
        f"the producer exited by itself ({producer.returncode}) before the kill: "
        f"{log.read_text()[-2000:]}")
    printed = [line.strip() for line in output if line.endswith("\n")]
    assert not any(line.startswith("done") for line in printed), "it finished before the kill"

    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool)
    spooled = client.spool.pending_count()
    assert client.close(30) == 0, "the new client did not deliver the leftovers"

    returned = set(printed)
    eventually(lambda: returned <= set(_stored_ids(bus, destination)), 60,
               "every returned message in MongoDB")
    stored = _stored_ids(bus, destination)
    extra = set(stored) - returned
    print(f"\nkill -9 after {len(printed)} returned sends (target {kill_after}); "
          f"{spooled} left in the spool and delivered by the next client; MongoDB holds "
          f"{len(stored)} ({len(set(stored))} distinct), {len(extra)} not returned by send()")
    assert returned <= set(stored)
    assert len(stored) == len(set(stored)), "a message was recorded twice"
    # one thread sends, so at most the one send() cut short by the kill is extra
    assert len(extra) <= 1


# ---- outage and recovery ---------------------------------------------------------------------


def _ordered_destination(bus: RunningBus, name: str) -> RecordingSubscriber:
    """A Kafka destination with one subscriber pushed one message at a time (ordered)."""
    bus.create_destination(name, "kafka")
    subscriber = bus.subscribe_recorder(name, "rec", max_concurrency=1)
    return subscriber


def test_outage_then_recovery_delivers_everything_in_send_order(
        bus: RunningBus, api_key: str, unique: str, spool_dir: Path) -> None:
    """Ordering is checked where it is observable message by message: at a subscriber with
    max_concurrency 1 on a Kafka destination, all messages under one biz_id (one partition).
    The stored received_at cannot show it: every message of one batch gets the same one."""
    destination = f"outage-{unique}"
    subscriber = _ordered_destination(bus, destination)
    with _gate_before(bus) as gate, MsgbusClient(gate.url, api_key, spool_dir=spool_dir,
                                                 **QUICK_RETRY) as client:
        ids = [client.send(destination, {"n": i}, biz_id=f"order-{unique}")
               for i in range(OUTAGE_MESSAGES)]
        assert client.spool.pending_count() == OUTAGE_MESSAGES
        assert gate.refused > 0 and gate.forwarded == 0  # the receiver really was unreachable

        gate.open()
        eventually(lambda: client.spool.pending_count() == 0, 60, "the spool to empty")
        assert client.spool.rejected_count() == 0
        assert client.close(10) == 0

    eventually(lambda: set(ids) <= set(_stored_ids(bus, destination)), 60,
               "every message in MongoDB")
    eventually(lambda: subscriber.message_ids() >= set(ids), 60, "every message pushed")
    _assert_same_order(bus, ids, _first_arrivals(subscriber, set(ids)))


def test_sends_during_recovery_do_not_overtake_the_backlog(
        bus: RunningBus, api_key: str, unique: str, spool_dir: Path) -> None:
    """The app keeps sending while the receiver comes back: the new messages must not overtake
    the ones spooled during the outage (same biz_id, ordered subscriber, as above)."""
    destination = f"recovery-{unique}"
    subscriber = _ordered_destination(bus, destination)
    biz = f"order-{unique}"
    with _gate_before(bus) as gate, MsgbusClient(gate.url, api_key, spool_dir=spool_dir,
                                                 **QUICK_RETRY) as client:
        ids = [client.send(destination, {"n": i}, biz_id=biz) for i in range(OUTAGE_MESSAGES)]
        gate.open()
        ids += [client.send(destination, {"n": i}, biz_id=biz)
                for i in range(OUTAGE_MESSAGES, 2 * OUTAGE_MESSAGES)]
        assert client.close(30) == 0

    eventually(lambda: set(ids) <= set(_stored_ids(bus, destination)), 60,
               "every message in MongoDB")
    eventually(lambda: subscriber.message_ids() >= set(ids), 60, "every message pushed")
    _assert_same_order(bus, ids, _first_arrivals(subscriber, set(ids)))


# ---- rejected messages -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["inline", "batch"])
def test_invalid_messages_are_rejected_with_the_receivers_error_and_the_rest_delivered(
        bus: RunningBus, api_key: str, unique: str, spool_dir: Path, path: str) -> None:
    """inline: each send() POSTs its message to the single endpoint. batch: the messages are
    spooled during an outage and then go out together in one batch request."""
    destination = f"rejects-{unique}"
    unknown = f"nowhere-{unique}"
    bus.create_destination(destination, "direct")
    too_large = "x" * (ReceiverSettings().max_message_bytes + 1)
    with contextlib.ExitStack() as stack:
        gate = stack.enter_context(_gate_before(bus)) if path == "batch" else None
        url = gate.url if gate is not None else bus.receiver_url
        # max_batch_bytes: room for the too-large message in the same batch as the others
        client = stack.enter_context(MsgbusClient(url, api_key, spool_dir=spool_dir,
                                                  max_batch_bytes=4_000_000, **QUICK_RETRY))
        valid = [client.send(destination, {"n": 0})]
        lost = client.send(unknown, {"n": 1})
        valid.append(client.send(destination, {"n": 2}))
        big = client.send(destination, {"blob": too_large})
        valid.append(client.send(destination, {"n": 4}))
        if gate is not None:
            assert client.spool.pending_count() == 5
            gate.open()
        eventually(lambda: client.spool.pending_count() == 0, 60, "the spool to settle")
        rejected = {r.message_id: r for r in client.list_rejected()}
        assert client.close(10) == 0

    assert set(rejected) == {lost, big}
    assert rejected[lost].status == 404
    assert rejected[lost].destination == unknown
    assert rejected[lost].error["error"] == "not_found"
    assert unknown in rejected[lost].error["message"]
    assert rejected[big].status == 413
    assert rejected[big].error["error"] == "message_too_large"
    assert rejected[big].message["body"] == {"blob": too_large}  # kept, to fix and resend

    eventually(lambda: set(valid) <= set(_stored_ids(bus, destination)), 60,
               "the valid messages in MongoDB")
    assert set(_stored_ids(bus, destination)) == set(valid)
