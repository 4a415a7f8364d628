"""`msgbus spool ...` as an operator (or the node DaemonSet) runs it, against the real receiver:
a spool that a killed producer left behind is inspected, rescued into the bus and removed; a
spool holding a message the receiver rejected is listed, re-sent and purged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from msgbus_client import MsgbusClient
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.children import SPOOLING_PRODUCER, ScriptChild, ScriptChildren
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
MSGBUS = [sys.executable, "-m", "msgbus_cli"]

def msgbus(*args: str, api_key: str = "") -> subprocess.CompletedProcess[str]:
    env = service_env()
    if api_key:
        env["MSGBUS_API_KEY"] = api_key
    return subprocess.run([*MSGBUS, "spool", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def failed(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one-line error of a refused command (never a traceback)."""
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def start_producer(children: ScriptChildren, api_key: str, spool_dir: Path, destination: str,
                   count: int) -> ScriptChild:
    """A producer that spools `count` messages (biz_id "left-N") to an unreachable receiver;
    its `lines` are their ids."""
    dead_url = f"http://127.0.0.1:{services.free_port()}"
    producer = children.start(SPOOLING_PRODUCER, dead_url, api_key, str(spool_dir), destination,
                              str(count))
    assert len(producer.lines) == count, "the producer did not spool its messages"
    return producer


def recorded_ids(bus: RunningBus, destination: str) -> set[str]:
    docs = bus.query(bus.store.traces.find_messages(destination=destination, limit=1000))
    return {str(d["_id"]) for d in docs}


def test_spool_of_a_killed_producer_is_inspected_rescued_into_the_bus_and_removed(
        bus: RunningBus, api_key: str, unique: str, tmp_path: Path,
        children: ScriptChildren) -> None:
    destination = f"left-{unique}"
    bus.create_destination(destination, "direct")
    root = tmp_path / "node"
    spool_dir = root / "shop" / "pod-7"
    producer = start_producer(children, api_key, spool_dir, destination, 30)

    # while the producer lives: visible, but neither rescued nor changed
    table = ok(msgbus("inspect", str(root)))
    assert f"held by pid={producer.proc.pid} " in table and str(spool_dir) in table
    assert table.splitlines()[1].split()[:2] == ["30", "0"]
    error = failed(msgbus("rescue", str(spool_dir), "--receiver", bus.receiver_url,
                          api_key=api_key))
    assert f"held by pid={producer.proc.pid} " in error and "not rescued" in error
    error = failed(msgbus("rejected", "purge", str(spool_dir), "--all"))
    assert "stop the process" in error

    producer.kill()
    [report] = json.loads(ok(msgbus("inspect", str(root), "--json", "--min-idle", "0")))
    assert (report["pending"], report["held_by"], report["orphaned"]) == (30, None, True)
    assert report["oldest_age_s"] >= 0
    orphans = ok(msgbus("orphans", str(root), "--min-idle", "0"))
    assert "orphaned" in orphans and str(spool_dir) in orphans
    assert "no spools to show" in ok(msgbus("orphans", str(root), "--min-idle", "3600"))

    rescued = msgbus("rescue", str(spool_dir), "--receiver", bus.receiver_url, api_key=api_key)
    summary = ok(rescued)
    assert "30 delivered, 0 rejected (kept), 0 left pending; dir removed" in summary
    assert f"rescuing {spool_dir}" in rescued.stderr  # the progress bar's label
    assert not spool_dir.exists()
    eventually(lambda: recorded_ids(bus, destination) == set(producer.lines), 30,
               "the rescued messages in MongoDB")
    doc = bus.query(bus.store.traces.get_message(producer.lines[7]))
    assert doc["biz_id"] == "left-7"


def test_rejected_message_is_listed_resent_and_purged(
        bus: RunningBus, api_key: str, unique: str, tmp_path: Path) -> None:
    known, unknown = f"known-{unique}", f"unknown-{unique}"
    bus.create_destination(known, "direct")
    spool_dir = tmp_path / "spool"
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    good = client.send(known, {"ok": True})
    bad = client.send(unknown, {"lost": "way"}, biz_id="b-1")
    assert client.close(10) == 0

    [entry] = json.loads(ok(msgbus("rejected", "list", str(spool_dir), "--json")))
    assert (entry["message_id"], entry["destination"], entry["status"]) == (bad, unknown, 404)
    assert entry["message"]["body"] == {"lost": "way"} and entry["error"]["field"] == "destination"
    assert f"{bad}  {unknown}  HTTP 404" in ok(msgbus("rejected", "list", str(spool_dir)))

    # what is left in the spool keeps the dir after a rescue; the exit status says so
    rescued = msgbus("rescue", str(spool_dir), "--receiver", bus.receiver_url, api_key=api_key)
    failed(rescued)
    assert "0 delivered, 1 rejected (kept), 0 left pending; dir kept" in rescued.stdout
    assert spool_dir.exists()

    # still unknown: re-sent, rejected again
    assert "1 message(s) moved back to pending" in ok(msgbus("rejected", "resend",
                                                             str(spool_dir), bad))
    [report] = json.loads(ok(msgbus("inspect", str(spool_dir), "--json")))
    assert (report["pending"], report["rejected"]) == (1, 0)
    failed(msgbus("rescue", str(spool_dir), "--receiver", bus.receiver_url, api_key=api_key))

    # errors are one line, with the usage error's own status
    assert "MESSAGE_ID... or --all" in failed(msgbus("rejected", "purge", str(spool_dir)), 2)
    assert "not a message id" in failed(msgbus("rejected", "purge", str(spool_dir), "nope"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no spool dirs in" in failed(msgbus("inspect", str(empty)))
    assert "not a msgbus spool dir" in failed(msgbus("rejected", "list", str(empty)))

    assert "1 rejected message(s) purged" in ok(msgbus("rejected", "purge", str(spool_dir), bad))
    assert "no rejected messages" in ok(msgbus("rejected", "list", str(spool_dir)))
    # `drain`, its name before 0.2, still works (hidden) and says the new name
    drained = msgbus("drain", str(spool_dir), "--receiver", bus.receiver_url, api_key=api_key)
    ok(drained)
    assert "`rescue` since 0.2" in drained.stderr
    assert not spool_dir.exists()
    assert recorded_ids(bus, unknown) == set()
    eventually(lambda: recorded_ids(bus, known) == {good}, 30, "the good message in MongoDB")


def test_resent_message_goes_out_once_its_destination_exists(
        bus: RunningBus, api_key: str, unique: str, tmp_path: Path) -> None:
    destination = f"late-{unique}"
    spool_dir = tmp_path / "spool"
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    message_id = client.send(destination, {"early": True})
    assert client.close(10) == 0
    bus.create_destination(destination, "direct")

    def resend_and_rescue() -> bool:
        """The receiver may still remember the destination as unknown for a moment."""
        ok(msgbus("rejected", "resend", str(spool_dir), "--all"))
        rescued = msgbus("rescue", str(spool_dir), "--receiver", bus.receiver_url,
                         api_key=api_key)
        return rescued.returncode == 0 and "1 delivered" in rescued.stdout

    eventually(resend_and_rescue, 30, "the re-sent message to be accepted")
    assert not spool_dir.exists()
    eventually(lambda: recorded_ids(bus, destination) == {message_id}, 30, "MongoDB record")

