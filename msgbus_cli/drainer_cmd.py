"""`msgbus spool-drainer`: drain the local queues that pods left behind on this node.

What it does is in receiver/node_rescue.py. It serves /health and /metrics on
MSGBUS_SPOOL_DRAINER_HOST:PORT until SIGTERM, or with --once scans the node once and exits
(status 1 when a queue could not be drained in full).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from msgbus.settings import ReceiverSettings, SpoolDrainerSettings
from msgbus_cli.stack import connection_settings, serve_until_signal, server, stop_on_signals

if TYPE_CHECKING:
    from receiver.node_rescue import NodeDrainer


@click.command("spool-drainer")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path),
              help="The node's msgbus root [env MSGBUS_SPOOL_DRAINER_ROOT, /var/lib/msgbus].")
@click.option("--min-idle", "min_idle_s", type=float,
              help="Seconds a queue nobody holds must be unwritten before it is drained "
                   "[env MSGBUS_SPOOL_DRAINER_MIN_IDLE_S, 600].")
@click.option("--interval", "scan_interval_s", type=float,
              help="Seconds between scans [env MSGBUS_SPOOL_DRAINER_SCAN_INTERVAL_S, 60].")
@click.option("--once", is_flag=True, help="Scan and drain once, print what was done, exit.")
def spool_drainer(root: Path | None, min_idle_s: float | None, scan_interval_s: float | None,
                  once: bool) -> None:
    """Drain orphaned receiver buffers and client spools on this node, then delete them.

    Receiver buffers go into the brokers and MongoDB (MSGBUS_* connection settings, as the
    receiver's), client spools to MSGBUS_SPOOL_DRAINER_RECEIVER_URL. A queue a live process
    holds is never touched.
    """
    from receiver.node_rescue import NodeDrainer
    from receiver.rescue import BufferRescuer

    overrides: dict[str, Any] = {"root": root, "min_idle_s": min_idle_s,
                                 "scan_interval_s": scan_interval_s}
    settings = SpoolDrainerSettings(**{k: v for k, v in overrides.items() if v is not None})
    conn = connection_settings(Path(os.environ.get("MSGBUS_STATE_DIR", ".msgbus")))
    rescuer = BufferRescuer(ReceiverSettings(connections=conn), settings.min_idle_s)
    drainer = NodeDrainer(settings, rescuer)
    if once:
        raise SystemExit(asyncio.run(_once(drainer)))
    asyncio.run(_serve(drainer))


async def _once(drainer: NodeDrainer) -> int:
    await drainer.rescuer.start()
    try:
        reports = await drainer.scan_once()
    finally:
        await drainer.rescuer.close()
    for r in reports:
        click.echo(f"{r.kind}: {r.held} held, {r.idle} idle, {r.orphaned} orphaned; "
                   f"{r.drained} drained and removed, {r.left} left, {r.failed} failed")
        for error in r.errors:
            click.echo(f"  {error}", err=True)
    return 0 if all(r.ok for r in reports) else 1


async def _serve(drainer: NodeDrainer) -> None:
    from fastapi import FastAPI

    from msgbus.http import service_app
    from msgbus.serving import ServerGroup

    app: FastAPI = service_app("msgbus spool-drainer", drainer)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "root": str(drainer.settings.root),
                "last_scan": {kind: vars(r) for kind, r in drainer.last.items()}}

    settings = drainer.settings
    stop = stop_on_signals()
    group = ServerGroup()
    await group.start(server(app, settings.host, settings.port), "spool-drainer")
    click.echo(f"msgbus spool-drainer on http://{settings.host}:{settings.port} over "
               f"{settings.root}", err=True)
    await serve_until_signal(group, stop)
