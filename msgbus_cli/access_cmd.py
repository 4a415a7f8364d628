"""`msgbus whoami|tokens|apps|audit` and the admin-API side of `msgbus users` (list, set,
delete): who may do what, through the admin API (URL, token and --output:
msgbus_cli/admin_client.py). `msgbus users add` writes MongoDB directly, for the first admin
before any API is reachable (users_cmd.py)."""

from __future__ import annotations

import sys
from typing import Any

import click

from msgbus.users import Role
from msgbus_cli.admin_client import YES_OPTION, AdminClient, admin_options

ROLES = click.Choice([r.value for r in Role])


@click.command("whoami")
@admin_options
def whoami(client: AdminClient) -> None:
    """Who the token acts as, with which role."""
    answer = client.call("GET", "/v1/session")
    client.show(answer, lambda a: f"{a['name']} ({a['role']}, via {a['via']}) at {client.url}"
                                  + "".join(f"\n  {role} of team {team}"
                                            for team, role in a.get("teams", {}).items()))


@click.command("list")
@admin_options
def users_list(client: AdminClient) -> None:
    """Every user (admin role)."""
    client.show_table(client.call("GET", "/v1/users"),
                      ("name", "role", "disabled", "created_at"), empty="no users")


@click.command("set")
@admin_options
@click.argument("name")
@click.option("--role", type=ROLES)
@click.option("--password-stdin", is_flag=True, help="Set the password read from stdin.")
@click.option("--disable/--enable", "disabled", default=None,
              help="A disabled user cannot log in; their tokens stop working.")
def users_set(client: AdminClient, name: str, role: str | None, password_stdin: bool,
              disabled: bool | None) -> None:
    """Create user NAME (--role and --password-stdin needed) or change the fields given."""
    body: dict[str, Any] = {"role": role, "disabled": disabled}
    if password_stdin:
        body["password"] = sys.stdin.readline().rstrip("\n")
    answer = client.call("PUT", f"/v1/users/{name}",
                         json={k: v for k, v in body.items() if v is not None})
    client.show(answer, lambda a: f"user {a['name']}: {a['role']}"
                                  f"{', disabled' if a.get('disabled') else ''}")


@click.command("delete")
@admin_options
@click.argument("name")
@YES_OPTION
def users_delete(client: AdminClient, name: str, yes: bool) -> None:
    """Delete user NAME."""
    client.call_confirmed(yes, f"Delete user {name}?", "DELETE", f"/v1/users/{name}")
    client.show({"deleted": name}, f"deleted user {name}")


@click.command("break-glass")
@admin_options
@click.option("--reason", required=True, help="Why (10 characters at least; audited).")
@click.option("--minutes", type=click.IntRange(1, 60), default=30, show_default=True)
def break_glass(client: AdminClient, reason: str, minutes: int) -> None:
    """Read every destination's messages for a while (an admin; the start and every read are
    audited)."""
    answer = client.call("POST", "/v1/break-glass", json={"reason": reason, "minutes": minutes})
    client.show(answer, lambda a: f"{a['user']} reads every destination's messages until "
                                  f"{a['until']} (audited)")


@click.command("locked")
@admin_options
def users_locked(client: AdminClient) -> None:
    """Who is locked out after failed sign-ins or wrong tokens (a user at an address, or an
    address), and until when."""
    client.show_table(client.call("GET", "/v1/signins/locked"),
                      ("kind", "key", "failures", "locked_until"), empty="nobody is locked out")


USERS_API_COMMANDS = (users_list, users_set, users_delete, users_locked)


@click.group()
def tokens() -> None:
    """API tokens of users: create (as the user the token given acts as), list, revoke."""


@tokens.command("create")
@admin_options
@click.argument("name")
@click.option("--role", type=ROLES, help="Acts with this role at most (default: the user's).")
def tokens_create(client: AdminClient, name: str, role: str | None) -> None:
    """A new token named NAME for the calling user; shown once."""
    answer = client.call("POST", "/v1/tokens", json={"name": name, "role": role})
    client.show(answer, lambda a: f"{a['token']}\n(token {a['token_id']}, {a['role']}; shown "
                                  "only once)")


@tokens.command("list")
@admin_options
def tokens_list(client: AdminClient) -> None:
    """Your tokens (an admin sees everyone's), without their secrets."""
    client.show_table(client.call("GET", "/v1/tokens"),
                      ("token_id", "user", "name", "role", "created_at", "last_used_at"),
                      empty="no tokens")


@tokens.command("revoke")
@admin_options
@click.argument("token_id")
def tokens_revoke(client: AdminClient, token_id: str) -> None:
    """The token stops working at once."""
    client.call("DELETE", f"/v1/tokens/{token_id}")
    client.show({"revoked": token_id}, f"revoked token {token_id}")


@click.group()
def apps() -> None:
    """Producer apps and their API keys (what `send` authenticates with)."""


@apps.command("create")
@admin_options
@click.argument("name")
@click.option("--destination", "destinations", multiple=True,
              help="A destination it may send to (repeatable; default: every one, '*').")
@click.option("--team", help="The team that owns it (default: yours, if you are in one).")
def apps_create(client: AdminClient, name: str, destinations: tuple[str, ...],
                team: str | None) -> None:
    """Producer app NAME with its first API key, shown once."""
    body = {"name": name, "destinations": list(destinations) or ["*"], "team": team}
    answer = client.call("POST", "/v1/apps", json={k: v for k, v in body.items() if v})
    client.show(answer, lambda a: f"{a['api_key']}\n(app {a['name']} may send to "
                                  f"{', '.join(a['destinations'])}; the key is shown only once)")


@apps.command("list")
@admin_options
def apps_list(client: AdminClient) -> None:
    """Producer apps: name, destinations, how many keys (never the keys)."""
    client.show_table(client.call("GET", "/v1/apps"),
                      ("name", "team", "destinations", "keys", "created_at", "revoked_at"),
                      empty="no producer apps")


@apps.command("add-key")
@admin_options
@click.argument("name")
def apps_add_key(client: AdminClient, name: str) -> None:
    """A further key for app NAME (rotate: deploy it, then revoke-keys the old ones)."""
    answer = client.call("POST", f"/v1/apps/{name}/keys")
    client.show(answer, lambda a: f"{a['api_key']}\n(shown only once)")


@apps.command("revoke-keys")
@admin_options
@click.argument("name")
@YES_OPTION
def apps_revoke_keys(client: AdminClient, name: str, yes: bool) -> None:
    """Every key of app NAME stops working within 30 s."""
    client.call_confirmed(yes, f"Revoke every key of app {name}?",
                          "DELETE", f"/v1/apps/{name}/keys")
    client.show({"revoked": name}, f"revoked every key of {name}")


@click.command("audit")
@admin_options
@click.option("--limit", default=50, show_default=True)
@click.option("--target", help="Only entries about this (e.g. orders/billing, a replay id).")
@click.option("--before", help="Only entries before this time (ISO 8601): the next page.")
def audit(client: AdminClient, limit: int, target: str | None, before: str | None) -> None:
    """The audit log, newest first: every change, who made it and how."""
    params = {k: v for k, v in {"limit": limit, "target": target, "before": before}.items()
              if v is not None}
    client.show_table(client.call("GET", "/v1/audit", params=params),
                      ("at", "by", "via", "action", "target", "details"), empty="no entries")
