"""`msgbus replay ...`, `msgbus parked ...` and `msgbus scheduled ...`: operator actions, through
the admin API.

The admin URL and token come from --admin / --token (MSGBUS_ADMIN_URL / MSGBUS_ADMIN_TOKEN) or
from the state directory that `msgbus up` wrote. Errors print the API's message and exit 1.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx

from msgbus.cli.stack import ADMIN_TOKEN_FILE, ADMIN_URL_FILE

POLL_S = 0.5
FINAL_STATES = ("done", "cancelled")

F = TypeVar("F", bound=Callable[..., Any])


class AdminClient:
    def __init__(self, url: str, token: str) -> None:
        self._http = httpx.Client(base_url=url, timeout=30,
                                  headers={"authorization": f"Bearer {token}"})

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise click.ClickException(f"admin API unreachable: {exc}") from exc
        if response.status_code >= 400:
            try:
                body = response.json()
                detail = body.get("message") or response.text
                if body.get("field"):
                    detail += f" (field: {body['field']})"
                for change in body.get("incompatibilities") or []:
                    detail += f"\n  {change['path']}: {change['message']} (breaks " \
                              f"{' and '.join(change['breaks'])})"
            except (ValueError, AttributeError):
                detail = response.text
            raise click.ClickException(f"{response.status_code}: {detail}")
        return response.json()


def _state_value(state_dir: Path, name: str, option: str) -> str:
    path = state_dir / name
    if not path.exists():
        raise click.UsageError(f"{path} not found: run `msgbus up` first or pass {option}")
    return path.read_text().strip()


def admin_options(command: F) -> F:
    """--state-dir, --admin and --token; the command gets a ready `client` argument."""

    @click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
                  default=lambda: os.environ.get("MSGBUS_STATE_DIR", ".msgbus"),
                  show_default=".msgbus", help="Where `msgbus up` keeps the admin URL/token.")
    @click.option("--admin", "admin_url", envvar="MSGBUS_ADMIN_URL",
                  help="Admin API URL (default: the one `msgbus up` wrote).")
    @click.option("--token", envvar="MSGBUS_ADMIN_TOKEN", help="Admin token.")
    @functools.wraps(command)
    def wrapper(state_dir: Path, admin_url: str | None, token: str | None,
                **kwargs: Any) -> Any:
        url = admin_url or _state_value(state_dir, ADMIN_URL_FILE, "--admin")
        secret = token or _state_value(state_dir, ADMIN_TOKEN_FILE, "--token")
        return command(client=AdminClient(url, secret), **kwargs)

    return wrapper  # type: ignore[return-value]


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
    click.echo(f"{answer['planned']} pushes to {', '.join(answer['subscriptions'])}")


@replay.command("run")
@admin_options
@range_options
@click.option("--by", "requested_by", default=lambda: os.environ.get("USER", "admin"),
              help="Who asks, for the audit record (default: $USER).")
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
    client.call("POST", f"/v1/replays/{job['replay_id']}/start",
                json={"requested_by": requested_by})
    click.echo(job["replay_id"])
    if detach:
        return
    try:
        job = watch(client, job["replay_id"])
    except KeyboardInterrupt:
        click.echo(f"\nstill running; `msgbus replay pause {job['replay_id']}` pauses it",
                   err=True)
        sys.exit(130)
    click.echo(_describe(job), err=True)


@replay.command("list")
@admin_options
@click.option("--limit", default=20, show_default=True)
def replay_list(client: AdminClient, limit: int) -> None:
    """Recent replay jobs, newest first."""
    for job in client.call("GET", "/v1/replays", params={"limit": limit}):
        click.echo(_describe(job))


@replay.command("show")
@admin_options
@click.argument("replay_id")
def replay_show(client: AdminClient, replay_id: str) -> None:
    """One job: state, progress and its audit trail."""
    job = client.call("GET", f"/v1/replays/{replay_id}")
    click.echo(_describe(job))
    for entry in job["audit"]:
        click.echo(f"  {entry['at']}  {entry['by']}: {entry['action']}")


@replay.command("watch")
@admin_options
@click.argument("replay_id")
def replay_watch(client: AdminClient, replay_id: str) -> None:
    """A progress bar until the job ends or is paused."""
    click.echo(_describe(watch(client, replay_id)), err=True)


def _transition_command(action: str) -> click.Command:
    @admin_options
    @click.argument("replay_id")
    @click.option("--by", "requested_by", default=lambda: os.environ.get("USER", "admin"),
                  help="Who asks, for the audit record (default: $USER).")
    def change(client: AdminClient, replay_id: str, requested_by: str) -> None:
        job = client.call("POST", f"/v1/replays/{replay_id}/{action}",
                          json={"requested_by": requested_by})
        click.echo(_describe(job))

    change.__doc__ = f"{action.capitalize()} a replay job."
    return click.command(action)(change)


for _action in ("start", "pause", "resume", "cancel"):
    replay.add_command(_transition_command(_action))


@click.group()
def parked() -> None:
    """Deliveries the retry policy gave up on: list them, re-drive them."""


@parked.command("list")
@admin_options
@click.argument("destination")
@click.argument("subscription")
@click.option("--limit", default=100, show_default=True)
def parked_list(client: AdminClient, destination: str, subscription: str, limit: int) -> None:
    found = client.call("GET", f"/v1/destinations/{destination}/subscriptions/{subscription}"
                               "/parked", params={"limit": limit})
    for d in found:
        click.echo(f"{d['message_id']}  attempts {d.get('attempts', 0)}  last "
                   f"{d.get('last_status_code') or d.get('last_error')}")
    click.echo(f"{len(found)} parked", err=True)


@parked.command("redrive")
@admin_options
@click.argument("destination")
@click.argument("subscription")
@click.option("--message", "message_ids", multiple=True,
              help="Only this message (repeatable; default: every parked delivery).")
@click.option("--by", "requested_by", default=lambda: os.environ.get("USER", "admin"),
              help="Who asks, for the audit record (default: $USER).")
def parked_redrive(client: AdminClient, destination: str, subscription: str,
                   message_ids: tuple[str, ...], requested_by: str) -> None:
    """Retry parked deliveries again now, their policy starting afresh."""
    answer = client.call(
        "POST", f"/v1/destinations/{destination}/subscriptions/{subscription}/parked/redrive",
        json={"message_ids": list(message_ids) or None, "requested_by": requested_by})
    click.echo(f"{answer['redriven']} re-driven")


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
    for d in found:
        held = "  (held in its key's order)" if d.get("held_in_place") else ""
        click.echo(f"{d.get('scheduled_for')}  {d['subscription']}  {d['message_id']}{held}")
    click.echo(f"{len(found)} scheduled", err=True)


@scheduled.command("deliver-now")
@admin_options
@click.argument("destination")
@click.argument("subscription")
@click.argument("message_ids", nargs=-1, required=True)
@click.option("--by", "requested_by", default=lambda: os.environ.get("USER", "admin"),
              help="Who asks, for the audit record (default: $USER).")
def scheduled_deliver_now(client: AdminClient, destination: str, subscription: str,
                          message_ids: tuple[str, ...], requested_by: str) -> None:
    """Push these messages' scheduled deliveries now."""
    answer = client.call(
        "POST", f"/v1/destinations/{destination}/subscriptions/{subscription}"
                "/scheduled/deliver-now",
        json={"message_ids": list(message_ids), "requested_by": requested_by})
    click.echo(f"{answer['delivered_now']} due now")


@scheduled.command("cancel")
@admin_options
@click.argument("destination")
@click.argument("subscription")
@click.argument("message_ids", nargs=-1, required=True)
@click.option("--reason", required=True, help="Why, for the audit record.")
@click.option("--by", "requested_by", default=lambda: os.environ.get("USER", "admin"),
              help="Who asks, for the audit record (default: $USER).")
def scheduled_cancel(client: AdminClient, destination: str, subscription: str,
                     message_ids: tuple[str, ...], reason: str, requested_by: str) -> None:
    """Drop these messages' scheduled deliveries before their time (kept as discarded)."""
    answer = client.call(
        "POST", f"/v1/destinations/{destination}/subscriptions/{subscription}/scheduled/cancel",
        json={"message_ids": list(message_ids), "reason": reason,
              "requested_by": requested_by})
    click.echo(f"{answer['cancelled']} cancelled")
