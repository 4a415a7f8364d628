"""The spool: size limit, one owner per dir, persistence."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from client_testkit import API_KEY, StubReceiver, free_port

from msgbus_client import MsgbusClient, SpoolError, SpoolFullError, SpoolLockedError
from msgbus_client.message import build_entry
from msgbus_client.spool import Spool

MakeClient = Callable[..., MsgbusClient]


def test_full_spool_raises_and_keeps_what_it_has(make_client: MakeClient) -> None:
    client = make_client(f"http://127.0.0.1:{free_port()}", max_spool_bytes=2000)
    kept = []
    with pytest.raises(SpoolFullError, match="max_spool_bytes=2000"):
        for n in range(100):
            kept.append(client.send("orders", {"n": n, "pad": "x" * 100}))
    assert 5 < len(kept) < 100
    assert client.spool.pending_count() == len(kept)
    assert client.spool.used_bytes <= 2000
    with pytest.raises(SpoolFullError):  # still full: nothing dropped, nothing overwritten
        client.send("orders", {"n": -1, "pad": "x" * 100})
    assert client.spool.pending_count() == len(kept)


def test_second_client_on_same_dir_in_process_is_refused(
    make_client: MakeClient, spool_dir: Path
) -> None:
    make_client(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SpoolLockedError, match=r"its own\s+spool_dir"):
        MsgbusClient("http://127.0.0.1:1", API_KEY, spool_dir=spool_dir)


def test_second_process_on_same_dir_gets_a_clear_error(
    make_client: MakeClient, spool_dir: Path
) -> None:
    make_client(f"http://127.0.0.1:{free_port()}")
    script = textwrap.dedent(
        f"""
        from msgbus_client import MsgbusClient, SpoolLockedError
        try:
            MsgbusClient("http://127.0.0.1:1", "k", spool_dir={str(spool_dir)!r})
        except SpoolLockedError as exc:
            print("LOCKED:", exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert out.startswith("LOCKED:")
    assert str(spool_dir) in out
    assert "own spool_dir" in out


def test_spool_keeps_entries_across_reopen_oldest_first(tmp_path: Path) -> None:
    entries = [build_entry("orders", {"n": n}) for n in range(5)]
    spool = Spool(tmp_path / "s")
    for entry in reversed(entries):  # insertion order does not matter: ids are time-ordered
        spool.put(entry)
    spool.close()
    with pytest.raises(SpoolError, match="closed"):
        spool.pending_count()

    again = Spool(tmp_path / "s")
    try:
        assert again.oldest(10, 1_000_000) == entries
        assert again.oldest(2, 1_000_000) == entries[:2]
        assert again.oldest(10, 1, skip={entries[0].key}) == entries[1:2]  # at least one
        assert again.used_bytes == sum(e.size for e in entries)
        stats = again.stats()
        assert (stats.pending, stats.rejected) == (5, 0)
    finally:
        again.close()


def test_closed_client_leaves_spool_readable_by_a_new_one(
    receiver: StubReceiver, spool_dir: Path
) -> None:
    client = MsgbusClient(f"http://127.0.0.1:{free_port()}", API_KEY, spool_dir=spool_dir)
    client.send("orders", 1)
    assert client.close(timeout_s=0) == 1
    spool = Spool(spool_dir)
    try:
        assert spool.pending_count() == 1
    finally:
        spool.close()


def test_lmdb_map_grows_when_page_overhead_fills_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_spool_bytes=50_000_000)
    try:
        spool._env.set_mapsize(1)  # type: ignore[union-attr]  # LMDB rounds up to its minimum
        entries = [build_entry("orders", "x" * 2000) for _ in range(200)]
        assert spool.append(entries) == []
        assert spool.pending_count() == 200
        spool.settle(entries)
        assert (spool.pending_count(), spool.used_bytes) == (0, 0)
    finally:
        spool.close()
