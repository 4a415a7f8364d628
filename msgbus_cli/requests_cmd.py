"""`msgbus requests`: subscription requests to destinations that take other teams'
subscriptions on their team's approval (admin/requests_routes.py)."""

from __future__ import annotations

import click

from msgbus_cli.admin_client import AdminClient, admin_options

COLUMNS = ("request_id", "destination", "name", "team", "state", "requested_by", "note")


@click.group("requests")
def requests() -> None:
    """Ask to subscribe to a destination that needs its team's approval; decide on asks."""


@requests.command("ask")
@admin_options
@click.argument("destination")
@click.argument("name")
@click.option("--url", required=True, help="The subscriber's endpoint.")
@click.option("--team", help="The team that asks (default: yours, if you are in one).")
@click.option("--note", default="", help="Why, for the team that decides.")
def requests_ask(client: AdminClient, destination: str, name: str, url: str,
                 team: str | None, note: str) -> None:
    """Ask DESTINATION's team for subscription NAME (pushing to --url)."""
    body = {"name": name, "note": note, "settings": {"url": url},
            **({} if team is None else {"team": team})}
    answer = client.call("POST", f"/v1/destinations/{destination}/subscription-requests",
                         json=body)
    client.show(answer, lambda a: f"asked ({a['request_id']}); {destination}'s team decides")


@requests.command("list")
@admin_options
@click.option("--state", type=click.Choice(["pending", "accepted", "declined"]))
def requests_list(client: AdminClient, state: str | None) -> None:
    """The newest requests your teams asked for or decide on."""
    rows = client.call("GET", "/v1/subscription-requests",
                       params={} if state is None else {"state": state})
    client.show_table(rows, COLUMNS, empty="no requests")


@requests.command("accept")
@admin_options
@click.argument("request_id")
@click.option("--reason", default="")
def requests_accept(client: AdminClient, request_id: str, reason: str) -> None:
    """Accept: the subscription is made, owned by the team that asked."""
    answer = client.call("POST", f"/v1/subscription-requests/{request_id}/accept",
                         json={"reason": reason})
    client.show(answer, lambda a: f"accepted: {a['destination']}/{a['name']} of team {a['team']}")


@requests.command("decline")
@admin_options
@click.argument("request_id")
@click.option("--reason", default="")
def requests_decline(client: AdminClient, request_id: str, reason: str) -> None:
    answer = client.call("POST", f"/v1/subscription-requests/{request_id}/decline",
                         json={"reason": reason})
    client.show(answer, lambda a: f"declined: {a['destination']}/{a['name']}")
