"""A full disk during a spool write: a clear SpoolDiskFullError, nothing half-written, and a
spool that stays usable. Real failures, no mocks: a child process lowers RLIMIT_FSIZE (with
SIGXFSZ ignored) so LMDB's writes beyond it fail with EFBIG, or with LMDB's "short write" EIO
when a write only partly fits; and, where user namespaces allow it, a tiny tmpfs gives ENOSPC."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from client_testkit import API_KEY, free_port

from msgbus_client import Spool

# Runs in a child: spool three messages, cap the file size at data.mdb's size + `slack` bytes,
# then try a big write. Prints one JSON line with what happened.
LIMITED_WRITER = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    from msgbus_client import MsgbusClient, Spool, SpoolDiskFullError
    from msgbus_client.message import build_entry

    mode, path, slack, url, key = sys.argv[1:]
    slack = int(slack)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write beyond the limit fails, no signal
    if mode == "client":
        client = MsgbusClient(url, key, spool_dir=path, retry_base_s=30)
        spool = client.spool
        ids = [client.send("orders", {"n": n}) for n in range(3)]
        write = lambda: client.send("orders", {"big": "x" * 200_000})
    else:
        spool = Spool(path)
        entries = [build_entry("orders", {"n": n}) for n in range(3)]
        spool.append(entries)
        ids = [e.message_id for e in entries]
        write = lambda: spool.put(build_entry("orders", {"big": "x" * 200_000}))
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + slack, hard))
    result = {"ids": ids}
    try:
        write()
    except SpoolDiskFullError as exc:
        result["error"] = str(exc)
    result["pending_after_error"] = spool.pending_count()
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again: the spool goes on
    spool.put(build_entry("orders", {"after": True}))
    result["pending_with_room"] = spool.pending_count()
    print(json.dumps(result), flush=True)
    os._exit(0)  # like a crash: no close(), nothing flushed
    """
)


def run_limited(mode: str, path: Path, slack: int) -> dict[str, Any]:
    dead_url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", LIMITED_WRITER, mode, str(path), str(slack), dead_url, API_KEY],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def pending_ids(path: Path) -> list[str]:
    spool = Spool(path)
    try:
        return [e.message_id for e in spool.oldest(1000, 10**9)]
    finally:
        spool.close()


@pytest.mark.parametrize(
    ("slack", "cause"),
    [(0, "file size limit is reached (EFBIG"), (100, "short write")],
    ids=["efbig", "short-write-eio"],
)
def test_disk_full_on_spool_write_is_clear_and_keeps_the_spool(
    tmp_path: Path, slack: int, cause: str
) -> None:
    path = tmp_path / "spool"
    result = run_limited("spool", path, slack)

    error = result.get("error")
    assert error is not None, "the write beyond the limit did not fail"
    assert f"cannot write to spool {path}" in error and cause in error
    assert "messages spooled before are intact" in error and "Free space" in error
    assert result["pending_after_error"] == 3
    assert result["pending_with_room"] == 4  # usable again once there is room, no reopen
    [*before, _after] = pending_ids(path)  # reopened, without the limit
    assert before == result["ids"]


def test_send_raises_spool_disk_full_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "spool"
    result = run_limited("client", path, 0)
    assert "file size limit is reached" in result["error"]
    assert result["pending_after_error"] == 3
    ids = pending_ids(path)
    assert ids[:3] == result["ids"] and len(ids) == 4  # the big message is not there at all


TMPFS_FILLER = textwrap.dedent(
    """
    import sys
    from msgbus_client import Spool, SpoolDiskFullError
    from msgbus_client.message import build_entry

    path = sys.argv[1] + "/spool"
    spool = Spool(path)
    written = 0
    try:
        while True:
            spool.put(build_entry("orders", {"pad": "x" * 3000, "n": written}))
            written += 1
    except SpoolDiskFullError as exc:
        print("error:", exc)
    spool.close()
    again = Spool(path)  # the mount lives as long as this namespace: check it here
    print("written:", written, "reopened:", again.pending_count())
    """
)


def test_full_tmpfs_raises_spool_disk_full(tmp_path: Path) -> None:
    """ENOSPC for real: a 256 KiB tmpfs in a private user + mount namespace (no root needed)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    mount = 'mount -t tmpfs -o size=256k tmpfs "$1" && exec "$2" -c "$3" "$1"'
    done = subprocess.run(
        [unshare, "-Urm", "sh", "-c", mount, "sh", str(tmp_path), sys.executable, TMPFS_FILLER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 and "error:" not in done.stdout:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "error: cannot write to spool" in done.stdout
    assert "filesystem" in done.stdout  # ENOSPC, or the short write of a full filesystem
    written = int(done.stdout.split("written:")[1].split()[0])
    reopened = int(done.stdout.split("reopened:")[1].split()[0])
    assert written > 10 and reopened == written
