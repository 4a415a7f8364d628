"""Spool tools (inspect, orphans, rescue), slots for several processes on one root, and the
non-owning lock probe. Owners run in child processes, as they do on a real node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_testkit import API_KEY, StubReceiver, eventually, free_port

from msgbus_client import Spool, SpoolError, SpoolLockedError, SpoolNotIdleError, spooltools
from msgbus_client.ids import uuid7_unix_ms
from msgbus_client.lockfile import LOCK_FILE_NAME, is_held
from msgbus_client.message import build_entry

# A child that owns a spool (a plain dir, or a slot under a root), reports what it holds, and
# spools one more message for every "send" line on stdin. Its receiver is unreachable.
OWNER = textwrap.dedent(
    """
    import sys
    from msgbus_client import Spool
    from msgbus_client.message import build_entry
    mode, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spool = Spool.open_slot(path) if mode == "slot" else Spool(path)
    spool.append([build_entry("orders", {"n": n}) for n in range(count)])
    print(spool.path, spool.pending_count(), flush=True)
    for line in sys.stdin:
        spool.put(build_entry("orders", {"more": True}))
        print(spool.pending_count(), flush=True)
    """
)


class Owner:
    def __init__(self, mode: str, path: Path, count: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OWNER, mode, str(path), str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line, "the owner child did not start"
        self.path, self.pending = Path(line[0]), int(line[1])

    def spool_one_more(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("send\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    started: list[Owner] = []
    yield started
    for owner in started:
        owner.kill()


def make_spool(path: Path, count: int) -> list[str]:
    """A closed (unheld) spool with `count` pending messages; returns their ids, oldest first."""
    spool = Spool(path)
    entries = [build_entry("orders", {"n": n}, biz_id=f"o-{n}") for n in range(count)]
    assert spool.append(entries) == []
    spool.close()
    return [e.message_id for e in entries]


def make_idle(path: Path, seconds: float = 3600) -> None:
    """Pretend data.mdb was last written `seconds` ago."""
    past = time.time() - seconds
    os.utime(path / "data.mdb", (past, past))


# -- inspect and orphans ------------------------------------------------------------------------


def test_inspect_reads_a_held_spool_without_disturbing_its_owner(
    tmp_path: Path, owners: list[Owner]
) -> None:
    owner = Owner("dir", tmp_path / "spool", 3)
    owners.append(owner)
    mtime = (owner.path / "data.mdb").stat().st_mtime_ns

    report = spooltools.inspect_spool(owner.path)
    assert (report.pending, report.rejected) == (3, 0)
    assert report.held_by is not None and f"pid={owner.proc.pid} " in report.held_by
    assert report.oldest_age_s is not None and report.oldest_age_s >= 0
    assert report.used_bytes > 0
    assert not report.orphaned(0)
    assert (owner.path / "data.mdb").stat().st_mtime_ns == mtime  # inspect wrote nothing

    assert owner.spool_one_more() == 4  # the owner still writes
    assert spooltools.inspect_spool(owner.path).pending == 4

    owner.kill()
    report = spooltools.inspect_spool(owner.path)
    assert report.held_by is None and report.pending == 4
    assert report.orphaned(0)
    assert not report.orphaned(3600)  # written just now: its process may be restarting


def test_inspect_refuses_what_is_not_a_spool(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpoolError, match="not a msgbus spool dir"):
        spooltools.inspect_spool(empty)
    with pytest.raises(SpoolError, match="not a msgbus spool dir"):
        spooltools.inspect_spool(tmp_path / "missing")
    assert is_held(empty) is None
    assert list(empty.iterdir()) == []  # the probe created no lock file


def test_inspect_refuses_a_spool_open_in_this_process(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    try:
        assert is_held(spool.path) is not None
        with pytest.raises(SpoolError, match="open in this process"):
            spooltools.inspect_spool(spool.path)
    finally:
        spool.close()
    assert is_held(spool.path) is None


def test_find_orphans_skips_held_and_recently_written_spools(
    tmp_path: Path, owners: list[Owner]
) -> None:
    root = tmp_path / "node"
    held = Owner("dir", root / "app-a" / "pod-1", 2)
    owners.append(held)
    make_idle(held.path)  # idle, but a live process holds it
    recent = root / "app-a" / "pod-2"
    make_spool(recent, 1)
    idle = root / "app-b" / "pod-3" / "slot-0"
    make_spool(idle, 2)
    make_idle(idle)
    too_deep = root / "a" / "b" / "c" / "d"
    make_spool(too_deep, 1)
    (root / "not-a-spool").mkdir()

    assert spooltools.find_spools(root) == [held.path, recent, idle]
    assert spooltools.find_spools(idle) == [idle]
    [orphan] = spooltools.find_orphans(root, min_idle_s=60)
    assert (orphan.path, orphan.pending, orphan.held_by) == (idle, 2, None)
    assert {r.path for r in spooltools.find_orphans(root, min_idle_s=0)} == {recent, idle}


# -- rescue -------------------------------------------------------------------------------------


def test_rescue_delivers_everything_in_order_then_removes_the_dir(
    tmp_path: Path, receiver: StubReceiver
) -> None:
    path = tmp_path / "left-behind"
    ids = make_spool(path, 250)
    make_idle(path)
    seen: list[tuple[int, int]] = []

    report = spooltools.rescue_spool(
        path, receiver.url, API_KEY, min_idle_s=60, progress=lambda n, t: seen.append((n, t))
    )

    assert receiver.ids() == ids  # oldest first
    assert [r.doc["biz_id"] for r in receiver.received] == [f"o-{n}" for n in range(250)]
    assert (report.delivered, report.rejected, report.left, report.removed) == (250, 0, 0, True)
    assert not path.exists()
    assert seen == [(100, 250), (200, 250), (250, 250)]  # one step per batch


def test_rescue_keeps_the_dir_while_rejected_messages_remain(
    tmp_path: Path, receiver: StubReceiver
) -> None:
    path = tmp_path / "spool"
    ids = make_spool(path, 4)
    receiver.set_rule(lambda dest, doc: (422, {"error": "bad"}) if doc["body"]["n"] == 2 else None)

    report = spooltools.rescue_spool(path, receiver.url, API_KEY)
    assert (report.delivered, report.rejected, report.left, report.removed) == (3, 1, 0, False)
    assert receiver.ids() == [ids[0], ids[1], ids[3]]
    [rejected] = spooltools.list_rejected(path)
    assert (rejected.message_id, rejected.status, rejected.error) == (ids[2], 422, {"error": "bad"})
    assert spooltools.inspect_spool(path).rejected == 1

    # fixed on the receiver: re-queue it, rescue again, and the dir goes
    receiver.set_rule(None)
    spool = spooltools.open_for_maintenance(path)
    assert spool.resend_all_rejected() == 1
    spool.close()
    report = spooltools.rescue_spool(path, receiver.url, API_KEY)
    assert (report.delivered, report.rejected, report.removed) == (1, 0, True)
    assert receiver.ids()[-1] == ids[2]
    assert not path.exists()


def test_rescue_refuses_a_held_spool(
    tmp_path: Path, receiver: StubReceiver, owners: list[Owner]
) -> None:
    owner = Owner("dir", tmp_path / "spool", 2)
    owners.append(owner)
    with pytest.raises(SpoolLockedError, match=f"held by pid={owner.proc.pid} "):
        spooltools.rescue_spool(owner.path, receiver.url, API_KEY)
    with pytest.raises(SpoolLockedError, match="held by"):
        spooltools.open_for_maintenance(owner.path)
    assert receiver.received == []
    assert owner.spool_one_more() == 3  # untouched, still its owner's


def test_rescue_refuses_a_recently_written_spool(tmp_path: Path, receiver: StubReceiver) -> None:
    path = tmp_path / "spool"
    make_spool(path, 1)
    with pytest.raises(SpoolNotIdleError, match="written"):
        spooltools.rescue_spool(path, receiver.url, API_KEY, min_idle_s=3600)
    assert receiver.received == [] and spooltools.inspect_spool(path).pending == 1


def test_rescue_stops_at_its_timeout_and_keeps_what_is_left(tmp_path: Path) -> None:
    path = tmp_path / "spool"
    make_spool(path, 3)
    dead_url = f"http://127.0.0.1:{free_port()}"
    report = spooltools.rescue_spool(path, dead_url, API_KEY, timeout_s=0.5)
    assert (report.delivered, report.left, report.removed) == (0, 3, False)
    assert spooltools.inspect_spool(path).pending == 3


def test_drain_spool_is_a_deprecated_alias_of_rescue_spool(
    tmp_path: Path, receiver: StubReceiver
) -> None:
    """Its name before 0.2 (docs/operations.md, "Renamed in 0.2"), for one more release."""
    path = tmp_path / "spool"
    ids = make_spool(path, 2)
    with pytest.warns(DeprecationWarning, match="rescue_spool"):
        report = spooltools.drain_spool(path, receiver.url, API_KEY)
    assert isinstance(report, spooltools.DrainReport) and report.removed
    assert receiver.ids() == ids


def test_rescue_waits_out_a_busy_receiver(tmp_path: Path, receiver: StubReceiver) -> None:
    path = tmp_path / "spool"
    ids = make_spool(path, 5)
    receiver.set_busy(503, retry_after="0.2")

    def recover() -> None:
        eventually(lambda: len(receiver.attempts) >= 2)
        receiver.set_ready()

    helper = threading.Thread(target=recover)
    helper.start()
    report = spooltools.rescue_spool(path, receiver.url, API_KEY, timeout_s=20)
    helper.join()
    assert receiver.ids() == ids and report.removed
    assert [a.status for a in receiver.attempts][:2] == [503, 503]


def test_spool_remove_refuses_while_messages_remain_and_the_path_is_reusable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spool"
    spool = Spool(path)
    spool.put(build_entry("orders", 1))
    with pytest.raises(SpoolError, match="still holds 1"):
        spool.remove()
    spool.close()
    assert path.exists()
    again = Spool(path)
    assert again.pending_count() == 1
    again.close()


# -- slots: several processes of one application on one root ------------------------------------


def test_processes_on_one_root_get_their_own_slots_and_a_restart_takes_over_a_dead_one(
    tmp_path: Path, owners: list[Owner]
) -> None:
    root = tmp_path / "app"
    first = Owner("slot", root, 3)
    owners.append(first)
    second = Owner("slot", root, 5)
    owners.append(second)
    assert (first.path, second.path) == (root / "slot-0", root / "slot-1")
    assert (first.pending, second.pending) == (3, 5)

    first.kill()  # kill -9: its 3 messages stay in slot-0
    third = Owner("slot", root, 1)
    owners.append(third)
    assert third.path == root / "slot-0"
    assert third.pending == 3 + 1  # the dead process's leftovers, plus its own
    assert spooltools.inspect_spool(root / "slot-1").held_by is not None


def test_open_slot_in_one_process_and_when_all_are_taken(tmp_path: Path) -> None:
    a = Spool.open_slot(tmp_path, max_slots=2)
    b = Spool.open_slot(tmp_path, max_slots=2)
    try:
        assert (a.path.name, b.path.name) == ("slot-0", "slot-1")
        with pytest.raises(SpoolLockedError, match="all 2 spool slots"):
            Spool.open_slot(tmp_path, max_slots=2)
    finally:
        a.close()
        b.close()


# -- spool additions ----------------------------------------------------------------------------


def test_oldest_message_ms_is_the_first_pending_id_time(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    try:
        assert spool.oldest_message_ms() is None
        first, second = build_entry("d", 1), build_entry("d", 2)
        spool.append([first, second])
        assert spool.oldest_message_ms() == uuid7_unix_ms(first.message_id)
        spool.settle([first])
        assert spool.oldest_message_ms() == uuid7_unix_ms(second.message_id)
    finally:
        spool.close()


def test_is_held_names_the_owner_and_leaves_no_trace(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    lock = spool.path / LOCK_FILE_NAME
    assert is_held(spool.path) == f"pid={os.getpid()} host={os.uname().nodename}"
    spool.close()
    assert is_held(spool.path) is None
    assert lock.read_text() == ""  # the probe wrote nothing
