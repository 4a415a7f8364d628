"""`msgbus status`: every service process and whether it sees MongoDB as available, through
the admin API (`GET /v1/services`; URL, token and --output: msgbus_cli/admin_client.py)."""

from __future__ import annotations

from typing import Any

import click

from msgbus_cli.admin_client import AdminClient, admin_options

COLUMNS = ("component", "instance", "reachable", "mongo", "flush_process")


def _gate(gate: dict[str, Any] | None) -> str:
    if gate is None:
        return ""
    if gate.get("available"):
        return "available"
    return f"unavailable since {gate.get('since')} ({gate.get('closed_by')}: {gate.get('reason')})"


def _row(service: dict[str, Any]) -> dict[str, Any]:
    flusher = service.get("flusher") or {}
    mongo = _gate(service.get("mongo")) if service.get("reachable") else service.get("error")
    return {"component": service.get("component"), "instance": service.get("instance"),
            "reachable": service.get("reachable"), "mongo": mongo,
            "flush_process": _gate(flusher.get("mongo")) if flusher.get("mode") == "process"
            else flusher.get("mode")}


@click.command("status")
@admin_options
def status(client: AdminClient) -> None:
    """Every service process and how it sees MongoDB (answers while MongoDB is down)."""
    answer = client.call("GET", "/v1/services")
    client.show_rows(answer, [_row(s) for s in answer["services"]], COLUMNS)
    if answer["unavailable"] and not client.json:
        click.echo(f"MongoDB unavailable to: {', '.join(answer['unavailable'])}", err=True)
