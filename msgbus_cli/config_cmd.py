"""`msgbus destination ...` and `msgbus subscription ...`: list, create or update, pause, resume,
test, skip, delete, and the subscription's signing secrets, through the admin API (URL, token
and --output: msgbus_cli/admin_client.py).

`put` on an existing destination or subscription sends its current settings with the options
given changed: the API's PUT replaces every field, and a field left out would go back to its
default (a paused subscription would resume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from msgbus_cli.admin_client import BY_OPTION, YES_OPTION, AdminClient, F, admin_options
from msgbus_cli.auth_options import auth_options, changed_auth, take_auth_options
from msgbus_cli.schema_cmd import schema

SUBSCRIPTION_COLUMNS = ("destination", "name", "url", "paused", "max_concurrency",
                        "max_rate_per_s", "timeout_ms", "ordered_by_biz_id",
                        "batch_max_messages", "delay_s", "team")
DESTINATION_COLUMNS = ("code", "broker", "partitions", "record_rate_per_s", "team",
                       "description")


def _json_option(value: str | None, name: str) -> Any:
    if value is None:
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=name) from exc


def _file_body(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    with click.open_file(str(path)) as file:
        loaded = _json_option(file.read(), str(path))
    if not isinstance(loaded, dict):
        raise click.BadParameter("must hold a JSON object", param_hint=str(path))
    return loaded


def _dispatchers_option(value: str) -> int | None:
    if value.strip().lower() == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a number nor 'all'",
                                 param_hint="--dispatchers") from None


def _changes(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


FROM_FILE = click.option("--from-file", type=click.Path(exists=True, dir_okay=False,
                                                        path_type=Path, allow_dash=True),
                         help="A JSON body of the API's PUT ('-': stdin); options override it.")


@click.group()
def destination() -> None:
    """Destinations: list, create or update, delete; replication; payload schemas."""


destination.add_command(schema)


def _current_destination(client: AdminClient, code: str) -> dict[str, Any]:
    found = client.call("GET", "/v1/destinations")
    return next((d for d in found if d["code"] == code), {})


@destination.command("list")
@admin_options
def destination_list(client: AdminClient) -> None:
    """Every destination."""
    client.show_table(client.call("GET", "/v1/destinations"), DESTINATION_COLUMNS,
                      empty="no destinations")


@destination.command("put")
@admin_options
@click.argument("code")
@click.option("--broker", type=click.Choice(["direct", "kafka", "rabbitmq"]),
              help="Where its messages go (a change is a broker switch: docs/operations.md).")
@click.option("--description")
@click.option("--team", help="The team that owns it (default: yours, if you are in one).")
@click.option("--owner", hidden=True, help="Before 0.2: a free-text owner label, read as a team.")
@click.option("--partitions", type=int)
@click.option("--record-rate", "record_rate_per_s", type=float,
              help="MongoDB record writes/s of each receiver; 0: unlimited.")
@click.option("--publishers", type=click.Choice(["any", "team", "listed"]),
              help="Which producer apps may send to it (besides --publisher-app).")
@click.option("--publisher-app", "publisher_apps", multiple=True,
              help="An app that may send to it (repeatable; replaces the list).")
@click.option("--subscribers", type=click.Choice(["any", "teams", "approval"]),
              help="Which teams may subscribe (besides --subscriber-team).")
@click.option("--subscriber-team", "subscriber_teams", multiple=True,
              help="A team that may subscribe (repeatable; replaces the list).")
@FROM_FILE
def destination_put(client: AdminClient, code: str, from_file: Path | None,
                    **options: Any) -> None:
    """Create destination CODE, or change the settings given of an existing one."""
    for listed in ("publisher_apps", "subscriber_teams"):  # none given: the list stays
        options[listed] = list(options[listed]) or None
    current = _current_destination(client, code)
    if options.get("owner"):  # the label names the team now (msgbus/teams.py)
        current.pop("team", None)
    body = current | _file_body(from_file) | _changes(**options)
    answer = client.call("PUT", f"/v1/destinations/{code}", json=body)
    client.show(answer, lambda a: f"{'updated' if current else 'created'} {a['code']} "
                                  f"({a['broker']}, {a['partitions']} partitions)")


@destination.command("delete")
@admin_options
@click.argument("code")
@YES_OPTION
def destination_delete(client: AdminClient, code: str, yes: bool) -> None:
    """Delete the destination and its subscriptions; remove its topics, exchanges, groups and
    queues (records stay)."""
    answer = client.call_confirmed(
        yes, f"Delete destination {code} and every subscription of it?",
        "DELETE", f"/v1/destinations/{code}")
    client.show(answer, lambda a: f"deleted {a['deleted']} and {len(a['subscriptions'])} "
                                  "subscription(s); its broker resources go within a minute")


@destination.command("replication")
@admin_options
@click.argument("code")
def destination_replication(client: AdminClient, code: str) -> None:
    """How many copies each cluster of its broker keeps, and the problems found."""
    answer = client.call("GET", f"/v1/destinations/{code}/replication")
    client.show(answer, lambda a: orjson.dumps(a, option=orjson.OPT_INDENT_2).decode())


@click.group()
def subscription() -> None:
    """Subscriptions: list, create or update, pause, resume, test, skip, delete; secrets."""


def _sub_path(code: str, name: str) -> str:
    return f"/v1/destinations/{code}/subscriptions/{name}"


def _current_subscription(client: AdminClient, code: str, name: str) -> dict[str, Any]:
    found = client.call("GET", "/v1/subscriptions", params={"destination": code})
    return next((s for s in found if s["name"] == name), {})


def _subscription_args(command: F) -> F:
    """DESTINATION NAME: the subscription a command acts on."""
    return click.argument("code", metavar="DESTINATION")(click.argument("name")(command))


@subscription.command("list")
@admin_options
@click.argument("destination", required=False)
def subscription_list(client: AdminClient, destination: str | None) -> None:
    """Every subscription, or those of DESTINATION."""
    params = {"destination": destination} if destination else {}
    client.show_table(client.call("GET", "/v1/subscriptions", params=params),
                      SUBSCRIPTION_COLUMNS, empty="no subscriptions")


@subscription.command("put")
@admin_options
@_subscription_args
@click.option("--url", help="The subscriber's endpoint (http or https).")
@click.option("--team", help="The team that owns it (default: yours, if you are in one).")
@click.option("--max-concurrency", type=int, help="Pushes at once, all processes together.")
@click.option("--max-rate", "max_rate_per_s", type=int, help="Pushes per second at most.")
@click.option("--timeout-ms", type=int)
@click.option("--max-in-flight", type=int)
@click.option("--ordered/--unordered", "ordered_by_biz_id", default=None,
              help="In order per biz_id.")
@click.option("--batch-max-messages", type=int)
@click.option("--delay-s", type=float, help="Push each message no sooner than this.")
@click.option("--retry-policy", help='JSON, e.g. {"delays_s": [10, 60], "max_attempts": 5}.')
@click.option("--circuit", help="JSON circuit breaker policy.")
@click.option("--filters", help="JSON list of message filters (docs/subscribers.md).")
@click.option("--dispatchers", metavar="N|all",
              help="How many dispatcher instances serve it (default 2), or all of them.")
@auth_options
@FROM_FILE
def subscription_put(client: AdminClient, code: str, name: str, from_file: Path | None,
                     retry_policy: str | None, circuit: str | None, filters: str | None,
                     dispatchers: str | None, **options: Any) -> None:
    """Create subscription NAME of destination CODE, or change the settings given of an
    existing one. The answer carries the signing secret the subscriber verifies with.

    Auth options (docs/subscribers.md, "Authenticating pushes") change only what they name;
    secrets come from environment variables, files or a prompt, never from the command line."""
    auth_given = take_auth_options(options)
    current = _current_subscription(client, code, name)
    given = _file_body(from_file)
    if not current and not options.get("url") and "url" not in given:
        raise click.UsageError(f"{code}/{name} does not exist yet: --url is required")
    body = current | given | _changes(
        retry_policy=_json_option(retry_policy, "--retry-policy"),
        circuit=_json_option(circuit, "--circuit"),
        filters=_json_option(filters, "--filters"), **options)
    if auth_given:
        body["auth"] = changed_auth(body.get("auth"), auth_given)
    if dispatchers is not None:
        body["dispatchers"] = _dispatchers_option(dispatchers)
    answer = client.call("PUT", _sub_path(code, name), json=body)
    client.show(answer, lambda a: (
        f"{'updated' if current else 'created'} {a['destination']}/{a['name']} -> {a['url']}\n"
        f"signing secret: {a['signing_secrets'][0]}"))


def _pause_command(action: str) -> click.Command:
    @admin_options
    @click.argument("code")
    @click.argument("name")
    def change(client: AdminClient, code: str, name: str) -> None:
        answer = client.call("POST", f"{_sub_path(code, name)}/{action}")
        client.show(answer, lambda a: f"{a['destination']}/{a['name']} "
                                      f"{'paused' if a['paused'] else 'resumed'}")

    change.__doc__ = ("Stop pushing to it within seconds (messages wait in the broker)."
                      if action == "pause" else "Push to it again.")
    return click.command(action)(change)


for _action in ("pause", "resume"):
    subscription.add_command(_pause_command(_action))


@subscription.command("test")
@admin_options
@_subscription_args
def subscription_test(client: AdminClient, code: str, name: str) -> None:
    """Push a signed test message to the subscriber now; exit 1 unless it answers 2xx."""
    answer = client.call("POST", f"{_sub_path(code, name)}/test")
    client.show(answer, lambda a: (
        f"{'ok' if a['ok'] else 'failed'}: {a['status_code'] or a['error']} in "
        f"{a['latency_ms']} ms (message {a['message_id']})"))
    if not answer["ok"]:
        raise SystemExit(1)


@subscription.command("pushers")
@admin_options
@_subscription_args
def subscription_pushers(client: AdminClient, code: str, name: str) -> None:
    """The processes pushing to it now, their shares of its cap, and its circuit."""
    answer = client.call("GET", f"{_sub_path(code, name)}/pushers")
    if client.json:
        client.show(answer)
        return
    click.echo(f"{answer['subscription']}: cap {answer['cap']}, circuit "
               f"{'open' if answer['circuit_open'] else 'closed'}")
    client.show_table(answer["pushers"], ("instance", "component", "share", "demand",
                                          "in_flight", "rate_share", "circuit_open",
                                          "heartbeat_at"), empty="no process pushes to it now")


@subscription.command("health")
@admin_options
@_subscription_args
@click.option("--range", "range_name", type=click.Choice(["hour", "day", "week"]),
              default="hour", show_default=True, help="per minute (hour) or per hour")
def subscription_health(client: AdminClient, code: str, name: str, range_name: str) -> None:
    """How it is doing: pushes by outcome, p50/p99 and backlog over time, its newest failures."""
    answer = client.call("GET", f"{_sub_path(code, name)}/health", params={"range": range_name})
    if client.json:
        client.show(answer)
        return
    rate = answer["success_rate"]
    click.echo(f"{answer['subscription']}: backlog {answer['backlog']}, oldest undelivered "
               f"{answer['oldest_age_s']} s, parked {answer['parked']}, {answer['pushes']} "
               f"pushes in the last {range_name}"
               + (f", {rate:.1%} delivered" if rate is not None else ""))
    client.show_table([b for b in answer["buckets"] if b["ok"] or b["failed"] or b["error"]],
                      ("at", "ok", "failed", "error", "p50_ms", "p99_ms", "backlog"),
                      empty="no pushes")
    client.show_table(answer["failures"], ("at", "message_id", "status_code", "error"),
                      empty="no failed push kept")


@subscription.command("delete")
@admin_options
@_subscription_args
@YES_OPTION
def subscription_delete(client: AdminClient, code: str, name: str, yes: bool) -> None:
    """Stop its pushes everywhere and remove its consumer group and queue (records stay)."""
    answer = client.call_confirmed(yes, f"Delete subscription {code}/{name}?",
                                   "DELETE", _sub_path(code, name))
    client.show(answer, lambda a: f"deleted {a['deleted']}; its broker resources go within "
                                  "a minute")


@subscription.command("skip")
@admin_options
@_subscription_args
@click.option("--reason", required=True, help="Why, recorded on each skipped delivery.")
@BY_OPTION
@YES_OPTION
def subscription_skip(client: AdminClient, code: str, name: str, reason: str,
                      requested_by: str, yes: bool) -> None:
    """Record everything it has not got yet as skipped (not pushed); push what comes next."""
    answer = client.call_confirmed(yes, f"Skip the backlog of {code}/{name}?",
                                   "POST", f"{_sub_path(code, name)}/skip",
                                   json={"reason": reason, "requested_by": requested_by})
    client.show(answer, lambda a: (
        f"skipped to {a['skip_before']}: {a['skipped_states']} undelivered states now "
        "skipped; what waits in the broker is skipped as it comes"))


@subscription.group("secret")
def secret() -> None:
    """The signing secrets subscribers verify pushes with (admin role; every action audited)."""


def _secrets_text(answer: dict[str, Any]) -> str:
    current, *previous = answer["signing_secrets"]
    until = answer.get("previous_secret_until")
    also = (f"also signed with until {until}" if until
            else "also signed with until `msgbus subscription secret drop-previous`")
    return "\n".join([answer["subscription"], f"current:  {current}",
                      *(f"previous: {p} ({also})" for p in previous)])


@secret.command("reveal")
@admin_options
@_subscription_args
def secret_reveal(client: AdminClient, code: str, name: str) -> None:
    """Show the subscription's signing secrets."""
    client.show(client.call("POST", f"{_sub_path(code, name)}/secrets/reveal"), _secrets_text)


@secret.command("rotate")
@admin_options
@_subscription_args
@click.option("--overlap-s", type=click.FloatRange(0, 30 * 24 * 3600),
              help="How long pushes are also signed with the current secret [default: the "
                   "API's, 24 h].")
@click.option("--until-dropped", is_flag=True,
              help="Sign with the current secret too until `secret drop-previous`.")
@YES_OPTION
def secret_rotate(client: AdminClient, code: str, name: str, overlap_s: float | None,
                  until_dropped: bool, yes: bool) -> None:
    """A new signing secret; for the overlap, pushes carry signatures with the new and the
    current one, so the subscriber can switch without a gap."""
    if overlap_s is not None and until_dropped:
        raise click.UsageError("give --overlap-s or --until-dropped, not both")
    if not yes:
        click.confirm(f"Rotate the signing secret of {code}/{name}? Pushes are then signed "
                      "with the new and the current one for the overlap.", abort=True)
    body = {"overlap_s": None} if until_dropped else (
        {"overlap_s": overlap_s} if overlap_s is not None else {})
    client.show(client.call("POST", f"{_sub_path(code, name)}/secrets/rotate", json=body),
                _secrets_text)


@secret.command("drop-previous")
@admin_options
@_subscription_args
@YES_OPTION
def secret_drop_previous(client: AdminClient, code: str, name: str, yes: bool) -> None:
    """Stop signing with the previous secret (once the subscriber verifies with the new one)."""
    if not yes:
        click.confirm(f"Stop signing {code}/{name}'s pushes with its previous secret?",
                      abort=True)
    client.show(client.call("DELETE", f"{_sub_path(code, name)}/secrets/previous"),
                _secrets_text)
