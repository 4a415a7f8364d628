"""`msgbus subscription delete|skip` and `msgbus destination delete`, through the admin API
(admin URL and token as for `msgbus replay`)."""

from __future__ import annotations

import os

import click

from msgbus.cli.ops_cmd import AdminClient, admin_options
from msgbus.cli.schema_cmd import schema


@click.group()
def subscription() -> None:
    """Delete a subscription, or skip its backlog to now."""


@subscription.command("delete")
@admin_options
@click.argument("destination")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def subscription_delete(client: AdminClient, destination: str, name: str, yes: bool) -> None:
    """Stop its pushes everywhere and remove its consumer group and queue (records stay)."""
    if not yes:
        click.confirm(f"Delete subscription {destination}/{name}?", abort=True)
    answer = client.call("DELETE", f"/v1/destinations/{destination}/subscriptions/{name}")
    click.echo(f"deleted {answer['deleted']}; its broker resources go within a minute")


@subscription.command("skip")
@admin_options
@click.argument("destination")
@click.argument("name")
@click.option("--reason", required=True, help="Why, recorded on each skipped delivery.")
@click.option("--by", "requested_by", default=lambda: os.environ.get("USER", "admin"),
              help="Who asks, for the audit record (default: $USER).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def subscription_skip(client: AdminClient, destination: str, name: str, reason: str,
                      requested_by: str, yes: bool) -> None:
    """Record everything it has not got yet as skipped (not pushed); push what comes next."""
    if not yes:
        click.confirm(f"Skip the backlog of {destination}/{name}?", abort=True)
    answer = client.call("POST", f"/v1/destinations/{destination}/subscriptions/{name}/skip",
                         json={"reason": reason, "requested_by": requested_by})
    click.echo(f"skipped to {answer['skip_before']}: {answer['skipped_states']} undelivered "
               "states now skipped; what waits in the broker is skipped as it comes")


@click.group()
def destination() -> None:
    """Delete a destination; its payload schemas."""


destination.add_command(schema)


@destination.command("delete")
@admin_options
@click.argument("code")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def destination_delete(client: AdminClient, code: str, yes: bool) -> None:
    """Delete the destination and its subscriptions; remove its topics, exchanges, groups and
    queues (records stay)."""
    if not yes:
        click.confirm(f"Delete destination {code} and every subscription of it?", abort=True)
    answer = client.call("DELETE", f"/v1/destinations/{code}")
    click.echo(f"deleted {answer['deleted']} and {len(answer['subscriptions'])} "
               "subscription(s); its broker resources go within a minute")
