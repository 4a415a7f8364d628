"""`msgbus replay ...`, `msgbus parked ...` and `msgbus scheduled ...`: operator actions, through
the admin API (URL, token and --output: msgbus_cli/admin_client.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from msgbus_cli.admin_client import (
    BY_OPTION,
    YES_OPTION,
    AdminClient,
    F,
    admin_options,
)

POLL_S = 0.5
FINAL_STATES = ("done", "cancelled")
REPLAY_COLUMNS = ("replay_id", "state", "done", "planned", "delivered", "failed",
                  "spec.destination", "spec.since", "spec.until", "requested_by")


def _spec(destination: str, since: str, until: str, subscriptions: tuple[str, ...],
          biz_id: str | None, statuses: tuple[str, ...], rate: float) -> dict[str, Any]:
    return {"destination": destination, "since": since, "until": until,
            "subscriptions": list(subscriptions) or None, "biz_id": biz_id,
            "statuses": list(statuses) or None, "rate_per_s": rate}


def _describe(job: dict[str, Any]) -> str:
    spec = job["spec"]
    return (f"{job['replay_id']}  {job['state']:<9} {job['done']}/{job['planned']} pushed "
            f"({job['delivered']} delivered, {job['failed']} failed)  {spec['destination']} "
            f"{spec['since']} .. {spec['until']}  by {job['requested_by']}")


def watch(client: AdminClient, replay_id: str) -> dict[str, Any]:
    """A progress bar until the job is done, cancelled or paused."""
    job = client.call("GET", f"/v1/replays/{replay_id}")
    with click.progressbar(length=max(job["planned"], 1), label=f"replay {replay_id}",
                           show_pos=True, file=sys.stderr) as bar:
        shown = 0
        while True:
            job = client.call("GET", f"/v1/replays/{replay_id}")
            bar.update(max(0, job["done"] - shown))
            shown = max(shown, job["done"])
            if job["state"] in (*FINAL_STATES, "paused"):
                return job
            time.sleep(POLL_S)


RANGE_OPTIONS = [
    click.argument("destination"),
    click.option("--since", required=True, help="Start of the range (ISO 8601, inclusive)."),
    click.option("--until", required=True, help="End of the range (ISO 8601, exclusive)."),
    click.option("--subscription", "subscriptions", multiple=True,
                 help="Subscription name (repeatable; default: all of the destination)."),
    click.option("--biz-id", help="Only messages with this biz_id."),
    click.option("--status", "statuses", multiple=True,
                 type=click.Choice(["pending", "delivered", "failed", "parked", "retrying",
                                    "skipped", "scheduled"]),
                 help="Only deliveries now in this state (repeatable)."),
    click.option("--rate", default=100.0, show_default=True, help="Pushes per second."),
]


def range_options(command: F) -> F:
    for option in reversed(RANGE_OPTIONS):
        command = option(command)
    return command


@click.group()
def replay() -> None:
    """Re-deliver a destination's messages of a time range (dry run, start, watch, pause)."""


@replay.command("plan")
@admin_options
@range_options
def replay_plan(client: AdminClient, **spec: Any) -> None:
    """Count what a replay would push (nothing is created)."""
    answer = client.call("POST", "/v1/replays", json={**_spec(**spec), "dry_run": True})
    client.show(answer, lambda a: f"{a['planned']} pushes to {', '.join(a['subscriptions'])}")


@replay.command("run")
@admin_options
@range_options
@BY_OPTION
@click.option("--yes", is_flag=True, help="Start without asking.")
@click.option("--detach", is_flag=True, help="Start it and return at once.")
def replay_run(client: AdminClient, requested_by: str, yes: bool, detach: bool,
               **spec: Any) -> None:
    """Dry run, confirm, start, then show progress until done."""
    body = {**_spec(**spec), "requested_by": requested_by}
    plan = client.call("POST", "/v1/replays", json={**body, "dry_run": True})
    click.echo(f"dry run: {plan['planned']} pushes to {', '.join(plan['subscriptions'])}",
               err=True)
    if not yes and not click.confirm("start this replay?", err=True):
        raise click.Abort()
    job = client.call("POST", "/v1/replays", json=body)
    job = client.call("POST", f"/v1/replays/{job['replay_id']}/start",
                      json={"requested_by": requested_by})
    if not client.json:
        click.echo(job["replay_id"])
    if not detach:
        try:
            job = watch(client, job["replay_id"])
        except KeyboardInterrupt:
            click.echo(f"\nstill running; `msgbus replay pause {job['replay_id']}` pauses it",
                       err=True)
            sys.exit(130)
        if not client.json:
            click.echo(_describe(job), err=True)
    if client.json:
        client.show(job)


@replay.command("list")
@admin_options
@click.option("--limit", default=20, show_default=True)
def replay_list(client: AdminClient, limit: int) -> None:
    """Recent replay jobs, newest first."""
    client.show_table(client.call("GET", "/v1/replays", params={"limit": limit}),
                      REPLAY_COLUMNS, empty="no replay jobs")


@replay.command("show")
@admin_options
@click.argument("replay_id")
def replay_show(client: AdminClient, replay_id: str) -> None:
    """One job: state, progress and its audit trail."""
    job = client.call("GET", f"/v1/replays/{replay_id}")
    client.show(job, lambda j: "\n".join([_describe(j), *(
        f"  {e['at']}  {e['by']}: {e['action']}" for e in j["audit"])]))


@replay.command("watch")
@admin_options
@click.argument("replay_id")
def replay_watch(client: AdminClient, replay_id: str) -> None:
    """A progress bar until the job ends or is paused."""
    job = watch(client, replay_id)
    if client.json:
        client.show(job)
    else:
        click.echo(_describe(job), err=True)


def _transition_command(action: str) -> click.Command:
    @admin_options
    @click.argument("replay_id")
    @BY_OPTION
    def change(client: AdminClient, replay_id: str, requested_by: str) -> None:
        job = client.call("POST", f"/v1/replays/{replay_id}/{action}",
                          json={"requested_by": requested_by})
        client.show(job, _describe)

    change.__doc__ = f"{action.capitalize()} a replay job."
    return click.command(action)(change)


for _action in ("start", "pause", "resume", "cancel"):
    replay.add_command(_transition_command(_action))


@click.group()
def parked() -> None:
    """Deliveries the retry policy gave up on: list them, re-drive or discard them."""


def _parked_path(destination: str, subscription: str) -> str:
    return f"/v1/destinations/{destination}/subscriptions/{subscription}/parked"


@parked.command("list")
@admin_options
@click.argument("destination")
@click.argument("subscription")
@click.option("--limit", default=100, show_default=True)
def parked_list(client: AdminClient, destination: str, subscription: str, limit: int) -> None:
    """The subscription's dead letters, oldest first."""
    found = client.call("GET", _parked_path(destination, subscription),
                        params={"limit": limit})
    client.show_table(found, ("message_id", "attempts", "last_status_code", "last_error",
                              "updated_at"), empty="nothing parked")


def _parked_deliveries(command: F) -> F:
    """DESTINATION SUBSCRIPTION [--message ID ...]: which parked deliveries a command acts on."""
    command = click.option("--message", "message_ids", multiple=True, help=(
        "Only this message (repeatable; default: every parked delivery)."))(command)
    command = click.argument("subscription")(command)
    return click.argument("destination")(command)


@parked.command("redrive")
@admin_options
@_parked_deliveries
@BY_OPTION
def parked_redrive(client: AdminClient, destination: str, subscription: str,
                   message_ids: tuple[str, ...], requested_by: str) -> None:
    """Retry parked deliveries again now, their policy starting afresh."""
    answer = client.call("POST", f"{_parked_path(destination, subscription)}/redrive",
                         json={"message_ids": list(message_ids) or None,
                               "requested_by": requested_by})
    client.show(answer, lambda a: f"{a['redriven']} re-driven")


@parked.command("discard")
@admin_options
@_parked_deliveries
@click.option("--reason", required=True, help="Why, for the audit record.")
@YES_OPTION
def parked_discard(client: AdminClient, destination: str, subscription: str,
                   message_ids: tuple[str, ...], reason: str, yes: bool) -> None:
    """Drop parked deliveries for good (they stay in the trace as discarded)."""
    what = f"{len(message_ids)} parked deliveries" if message_ids else "every parked delivery"
    answer = client.call_confirmed(yes, f"Discard {what} of {destination}/{subscription}?",
                                   "POST", f"{_parked_path(destination, subscription)}/discard",
                                   json={"message_ids": list(message_ids) or None,
                                         "reason": reason})
    client.show(answer, lambda a: f"{a['discarded']} discarded")


@click.group()
def scheduled() -> None:
    """Deliveries waiting for their time (deliver_at, delay_s): list, deliver now, cancel."""


@scheduled.command("list")
@admin_options
@click.argument("destination")
@click.option("--limit", default=100, show_default=True)
def scheduled_list(client: AdminClient, destination: str, limit: int) -> None:
    """The destination's scheduled deliveries, soonest first."""
    found = client.call("GET", f"/v1/destinations/{destination}/scheduled",
                        params={"limit": limit})
    client.show_table(found, ("scheduled_for", "subscription", "message_id", "held_in_place"),
                      empty="nothing scheduled")


def _scheduled_path(destination: str, subscription: str, action: str) -> str:
    return f"/v1/destinations/{destination}/subscriptions/{subscription}/scheduled/{action}"


@scheduled.command("deliver-now")
@admin_options
@click.argument("destination")
@click.argument("subscription")
@click.argument("message_ids", nargs=-1, required=True)
@BY_OPTION
def scheduled_deliver_now(client: AdminClient, destination: str, subscription: str,
                          message_ids: tuple[str, ...], requested_by: str) -> None:
    """Push these messages' scheduled deliveries now."""
    answer = client.call("POST", _scheduled_path(destination, subscription, "deliver-now"),
                         json={"message_ids": list(message_ids), "requested_by": requested_by})
    client.show(answer, lambda a: f"{a['delivered_now']} due now")


@scheduled.command("cancel")
@admin_options
@click.argument("destination")
@click.argument("subscription")
@click.argument("message_ids", nargs=-1, required=True)
@click.option("--reason", required=True, help="Why, for the audit record.")
@BY_OPTION
def scheduled_cancel(client: AdminClient, destination: str, subscription: str,
                     message_ids: tuple[str, ...], reason: str, requested_by: str) -> None:
    """Drop these messages' scheduled deliveries before their time (kept as discarded)."""
    answer = client.call("POST", _scheduled_path(destination, subscription, "cancel"),
                         json={"message_ids": list(message_ids), "reason": reason,
                               "requested_by": requested_by})
    client.show(answer, lambda a: f"{a['cancelled']} cancelled")
