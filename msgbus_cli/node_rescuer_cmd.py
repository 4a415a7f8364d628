"""`msgbus node-rescuer`: rescue the local queues that pods left behind on this node.

What it does is in receiver/node_rescue.py. It serves /health and /metrics on
MSGBUS_NODE_RESCUER_HOST:PORT until SIGTERM, or with --once scans the node once and exits
(status 1 when a queue could not be rescued in full). Until 0.2 it was `msgbus spool-drainer`,
a name that still works (msgbus_cli/aliases.py).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from msgbus.settings import NodeRescuerSettings, ReceiverSettings
from msgbus_cli.stack import connection_settings, serve_until_signal, server, stop_on_signals

if TYPE_CHECKING:
    from receiver.node_rescue import NodeRescuer


@click.command("node-rescuer")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path),
              help="The node's msgbus root [env MSGBUS_NODE_RESCUER_ROOT, /var/lib/msgbus].")
@click.option("--min-idle", "min_idle_s", type=float,
              help="Seconds a queue nobody holds must be unwritten before it is rescued "
                   "[env MSGBUS_NODE_RESCUER_MIN_IDLE_S, 600].")
@click.option("--interval", "scan_interval_s", type=float,
              help="Seconds between scans [env MSGBUS_NODE_RESCUER_SCAN_INTERVAL_S, 60].")
@click.option("--once", is_flag=True, help="Scan and rescue once, print what was done, exit.")
def node_rescuer(root: Path | None, min_idle_s: float | None, scan_interval_s: float | None,
                 once: bool) -> None:
    """Rescue orphaned receiver buffers and client spools on this node, then delete them.

    Receiver buffers are flushed into the brokers and MongoDB (MSGBUS_* connection settings, as
    the receiver's), client spools sent to MSGBUS_NODE_RESCUER_RECEIVER_URL. A queue a live
    process holds is never touched.
    """
    from receiver.node_rescue import NodeRescuer
    from receiver.rescue import BufferRescuer

    overrides: dict[str, Any] = {"root": root, "min_idle_s": min_idle_s,
                                 "scan_interval_s": scan_interval_s}
    settings = NodeRescuerSettings(**{k: v for k, v in overrides.items() if v is not None})
    conn = connection_settings(Path(os.environ.get("MSGBUS_STATE_DIR", ".msgbus")))
    rescuer = BufferRescuer(ReceiverSettings(connections=conn), settings.min_idle_s)
    node = NodeRescuer(settings, rescuer)
    if once:
        raise SystemExit(asyncio.run(_once(node)))
    asyncio.run(_serve(node))


async def _once(node: NodeRescuer) -> int:
    await node.rescuer.start()
    try:
        reports = await node.scan_once()
    finally:
        await node.rescuer.close()
    for r in reports:
        click.echo(f"{r.kind}: {r.held} held, {r.idle} idle, {r.orphaned} orphaned; "
                   f"{r.rescued} rescued and removed, {r.left} left, {r.failed} failed")
        for error in r.errors:
            click.echo(f"  {error}", err=True)
    return 0 if all(r.ok for r in reports) else 1


async def _serve(node: NodeRescuer) -> None:
    from fastapi import FastAPI

    from msgbus.http import service_app
    from msgbus.serving import ServerGroup

    app: FastAPI = service_app("msgbus node-rescuer", node)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "root": str(node.settings.root),
                "last_scan": {kind: vars(r) for kind, r in node.last.items()}}

    settings = node.settings
    stop = stop_on_signals()
    group = ServerGroup()
    await group.start(server(app, settings.host, settings.port), "node-rescuer")
    click.echo(f"msgbus node-rescuer on http://{settings.host}:{settings.port} over "
               f"{settings.root}", err=True)
    await serve_until_signal(group, stop)
