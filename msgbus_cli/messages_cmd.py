"""`msgbus messages search|show`, `msgbus invalid-docs list|delete` and `msgbus runtime
show|set`, through the admin API (URL, token and --output: msgbus_cli/admin_client.py)."""

from __future__ import annotations

from typing import Any

import click

from msgbus_cli.admin_client import YES_OPTION, AdminClient, admin_options

MESSAGE_COLUMNS = ("message_id", "destination", "biz_id", "source_app", "received_at")
ATTEMPT_COLUMNS = ("attempt", "at", "status_code", "latency_ms", "error", "by")


@click.group()
def messages() -> None:
    """Find messages and read their delivery timeline."""


@messages.command("search")
@admin_options
@click.option("--biz-id", help="Only messages with this business key.")
@click.option("--destination", help="Only this destination's.")
@click.option("--since", help="Received at or after this time (ISO 8601).")
@click.option("--until", help="Received before this time (ISO 8601).")
@click.option("--limit", default=50, show_default=True)
def messages_search(client: AdminClient, biz_id: str | None, destination: str | None,
                    since: str | None, until: str | None, limit: int) -> None:
    """Messages, newest first."""
    params = {k: v for k, v in {"biz_id": biz_id, "destination": destination, "since": since,
                                "until": until, "limit": limit}.items() if v is not None}
    client.show_table(client.call("GET", "/v1/messages", params=params), MESSAGE_COLUMNS,
                      empty="no messages")


def _timeline_text(answer: dict[str, Any]) -> str:
    message = answer["message"]
    lines = [f"message {message['message_id']} to {message['destination']}"
             f"{'  biz_id ' + message['biz_id'] if message.get('biz_id') else ''}"
             f"  received {message.get('received_at', '')}",
             f"body: {message['body'][:200]}"]
    for delivery in answer["deliveries"]:
        upcoming = delivery.get("next_attempt_at")
        lines.append(f"\n{delivery['subscription']}: {delivery.get('status')}"
                     f"{f'  next attempt {upcoming}' if upcoming else ''}")
        for attempt in delivery.get("attempts_log", []):
            lines.append("  " + "  ".join(
                f"{c}={_short(attempt[c])}" for c in ATTEMPT_COLUMNS
                if attempt.get(c) is not None))
    return "\n".join(lines)


def _short(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


@messages.command("show")
@admin_options
@click.argument("message_id")
def messages_show(client: AdminClient, message_id: str) -> None:
    """One message: its body, and per subscription its state and every attempt."""
    client.show(client.call("GET", f"/v1/messages/{message_id}"), _timeline_text)


@click.group("invalid-docs")
def invalid_docs() -> None:
    """Stored configuration that does not validate (every service skips it)."""


@invalid_docs.command("list")
@admin_options
def invalid_docs_list(client: AdminClient) -> None:
    """Every configuration document that does not validate, with the field and reason."""
    answer = client.call("GET", "/v1/invalid-documents")
    client.show_rows(answer, answer["documents"], ("collection", "id", "field", "reason"),
                     empty="every stored document validates")


@invalid_docs.command("delete")
@admin_options
@click.argument("collection")
@click.argument("doc_id")
@YES_OPTION
def invalid_docs_delete(client: AdminClient, collection: str, doc_id: str, yes: bool) -> None:
    """Delete one document that does not validate (a valid one is refused)."""
    client.call_confirmed(yes, f"Delete {collection}/{doc_id}?",
                          "DELETE", f"/v1/invalid-documents/{collection}/{doc_id}")
    client.show({"deleted": f"{collection}/{doc_id}"}, f"deleted {collection}/{doc_id}")


@click.group()
def runtime() -> None:
    """Settings the running services pick up: record rate, the active broker clusters."""


def _runtime_text(answer: dict[str, Any]) -> str:
    lines = [f"record rate per receiver: {answer.get('record_rate_per_s') or 'unlimited'}/s"]
    for kind, clusters in answer.get("clusters", {}).items():
        active = (answer.get("active_clusters") or {}).get(kind)
        lines.append(f"{kind}: clusters {', '.join(clusters) or 'none'}"
                     f"{'; active ' + active if active else ''}")
    return "\n".join(lines)


@runtime.command("show")
@admin_options
def runtime_show(client: AdminClient) -> None:
    """The runtime settings and the clusters each broker kind has."""
    client.show(client.call("GET", "/v1/runtime"), _runtime_text)


@runtime.command("set")
@admin_options
@click.option("--record-rate", "record_rate_per_s", type=float,
              help="MongoDB record writes/s of each receiver, all destinations; 0: unlimited.")
@click.option("--active-cluster", "active_clusters", multiple=True, metavar="KIND=CLUSTER",
              help="Where receivers publish that broker kind (repeatable), e.g. kafka=standby.")
def runtime_set(client: AdminClient, record_rate_per_s: float | None,
                active_clusters: tuple[str, ...]) -> None:
    """Change the settings given; the others keep their value."""
    body: dict[str, Any] = {}
    if record_rate_per_s is not None:
        body["record_rate_per_s"] = record_rate_per_s
    if active_clusters:
        pairs = [a.split("=", 1) for a in active_clusters]
        if any(len(p) != 2 for p in pairs):
            raise click.BadParameter("KIND=CLUSTER, e.g. kafka=standby",
                                     param_hint="--active-cluster")
        body["active_clusters"] = dict(pairs)
    client.show(client.call("PATCH", "/v1/runtime", json=body), _runtime_text)
