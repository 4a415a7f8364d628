"""Which process holds which TCP socket, from /proc (Linux): lets a test tell which of several
processes sharing a port (SO_REUSEPORT) listens, or served a given client connection."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_LISTEN = "0A"
_ESTABLISHED = "01"


def children_of(pid: int) -> list[int]:
    """Live direct children of `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return sorted(found)


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    return inodes


def _tcp_inodes(local_port: int, state: str, remote_port: int | None = None) -> set[int]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote, st, inode = fields[1], fields[2], fields[3], int(fields[9])
                if (st == state and int(local.rsplit(":", 1)[1], 16) == local_port
                        and (remote_port is None
                             or int(remote.rsplit(":", 1)[1], 16) == remote_port)):
                    inodes.add(inode)
    return inodes


def listening(pids: list[int], port: int) -> set[int]:
    """Those of `pids` that listen on `port`."""
    inodes = _tcp_inodes(port, _LISTEN)
    return {pid for pid in pids if _socket_inodes(pid) & inodes}


def serving(pids: list[int], server_port: int, client_port: int) -> int | None:
    """Which of `pids` holds the server end of the connection from `client_port`."""
    inodes = _tcp_inodes(server_port, _ESTABLISHED, client_port)
    return next((pid for pid in pids if _socket_inodes(pid) & inodes), None)
