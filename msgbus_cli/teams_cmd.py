"""`msgbus teams`: the teams that own destinations, subscriptions and producer apps, and their
members, through the admin API (msgbus/permissions.py says who may do what)."""

from __future__ import annotations

from typing import Any

import click

from msgbus.teams import TeamRole
from msgbus_cli.admin_client import YES_OPTION, AdminClient, admin_options

TEAM_ROLES = click.Choice([r.value for r in TeamRole])


def _members(team: dict[str, Any]) -> str:
    return ", ".join(f"{m['user']} ({m['role']})" for m in team["members"]) or "no members"


@click.group("teams")
def teams() -> None:
    """Teams and their members."""


@teams.command("list")
@admin_options
def teams_list(client: AdminClient) -> None:
    """Every team, with its members."""
    rows = [t | {"members": _members(t)} for t in client.call("GET", "/v1/teams")]
    client.show_table(rows, ("name", "description", "members"), empty="no teams")


@teams.command("put")
@admin_options
@click.argument("name")
@click.option("--description", default=None)
def teams_put(client: AdminClient, name: str, description: str | None) -> None:
    """Make team NAME (an admin), or change its description (its owners); members stay."""
    current = next((t for t in client.call("GET", "/v1/teams") if t["name"] == name), None)
    body = {"description": description if description is not None
            else (current or {}).get("description", ""),
            "members": (current or {}).get("members", [])}
    answer = client.call("PUT", f"/v1/teams/{name}", json=body)
    client.show(answer, lambda a: f"team {a['name']}: {_members(a)}")


@teams.command("add-member")
@admin_options
@click.argument("name")
@click.argument("user")
@click.option("--role", type=TEAM_ROLES, default=TeamRole.VIEWER.value, show_default=True)
def teams_add_member(client: AdminClient, name: str, user: str, role: str) -> None:
    """USER joins team NAME with --role, or takes that role if a member already."""
    answer = client.call("PUT", f"/v1/teams/{name}/members/{user}", json={"role": role})
    client.show(answer, lambda a: f"team {a['name']}: {_members(a)}")


@teams.command("remove-member")
@admin_options
@click.argument("name")
@click.argument("user")
def teams_remove_member(client: AdminClient, name: str, user: str) -> None:
    """USER leaves team NAME and loses its rights with the next request."""
    answer = client.call("DELETE", f"/v1/teams/{name}/members/{user}")
    client.show(answer, lambda a: f"team {a['name']}: {_members(a)}")


@teams.command("delete")
@admin_options
@click.argument("name")
@YES_OPTION
def teams_delete(client: AdminClient, name: str, yes: bool) -> None:
    """Delete team NAME (an admin; only a team that owns nothing)."""
    client.call_confirmed(yes, f"Delete team {name}?", "DELETE", f"/v1/teams/{name}")
    client.show({"deleted": name}, f"deleted team {name}")
