"""The embedded servers of `msgbus up`: what it runs when no MongoDB is configured."""

from __future__ import annotations

from pathlib import Path

from msgbus_devtools import servers


def start_mongo(state_dir: Path) -> servers.Running:
    """A SecantusDB server on a free port, its data and log under `state_dir`."""
    return servers.start_secantus(servers.free_port(), state_dir / "mongo", state_dir / "logs")
