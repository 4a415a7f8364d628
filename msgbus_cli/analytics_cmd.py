"""`msgbus analytics stats|archive|trace`: the PySpark jobs (package `analytics`, installed with
the `analytics` extra). MongoDB is MSGBUS_MONGO_URI / MSGBUS_MONGO_DB unless --mongo-uri /
--mongo-db say otherwise; the other knobs are MSGBUS_ANALYTICS_* (analytics/settings.py)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from msgbus.settings import ConnectionSettings

if TYPE_CHECKING:
    from analytics.settings import AnalyticsSettings

F = TypeVar("F", bound=Callable[..., Any])


def parse_time(value: str) -> datetime:
    """ISO 8601 date or date-time (UTC unless it says otherwise), or `now`."""
    if value.strip().lower() == "now":
        return datetime.now(UTC)
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 date or time") from exc
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def spark_options(command: F) -> F:
    options = [
        click.option("--master", help="Spark master URL [default: local[*], or "
                                      "MSGBUS_ANALYTICS_MASTER]"),
        click.option("--mongo-uri", help="MongoDB URI [default: MSGBUS_MONGO_URI]"),
        click.option("--mongo-db", help="MongoDB database [default: MSGBUS_MONGO_DB]"),
        click.option("--archive-dir", type=click.Path(file_okay=False, path_type=Path),
                     help="The Parquet archive [default: .msgbus/archive, or "
                          "MSGBUS_ANALYTICS_ARCHIVE_DIR]"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def build_settings(master: str | None, mongo_uri: str | None, mongo_db: str | None,
                   archive_dir: Path | None) -> AnalyticsSettings:
    try:
        from analytics.settings import AnalyticsSettings
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise click.ClickException(
            f"the analytics extra is not installed ({exc}): pip install -e '.[analytics]'"
        ) from exc
    conn = ConnectionSettings()
    overrides: dict[str, Any] = {"mongo_uri": mongo_uri or conn.mongo_uri,
                                 "mongo_db": mongo_db or conn.mongo_db}
    if master:
        overrides["master"] = master
    if archive_dir is not None:
        overrides["archive_dir"] = archive_dir
    return AnalyticsSettings().model_copy(update=overrides)


def analytics_errors(command: F) -> F:
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        from analytics.errors import AnalyticsError

        try:
            return command(*args, **kwargs)
        except AnalyticsError as exc:
            raise click.ClickException(str(exc)) from exc

    return run  # type: ignore[return-value]


@click.group()
def analytics() -> None:
    """Delivery statistics, archives and traces of old messages (PySpark)."""
    for chatty in ("py4j", "matplotlib"):  # py4j logs every connection, matplotlib its guesses
        logging.getLogger(chatty).setLevel(logging.WARNING)


@analytics.command()
@click.option("--from", "start", required=True, help="Start of the range (ISO 8601, UTC).")
@click.option("--to", "end", required=True, help="End of the range, excluded (or `now`).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the Parquet tables and report.html go "
                   "[default: .msgbus/analytics/stats-FROM-TO]")
@click.option("--source", type=click.Choice(["mongo", "archive"]), default="mongo",
              show_default=True, help="Read MongoDB, or the Parquet archive.")
@spark_options
@analytics_errors
def stats(start: str, end: str, out_dir: Path | None, source: str, master: str | None,
          mongo_uri: str | None, mongo_db: str | None, archive_dir: Path | None) -> None:
    """Statistics per destination, subscription, hour and day, as Parquet and an HTML report."""
    from analytics.progress import Progress
    from analytics.session import build_spark
    from analytics.stats_job import run_stats

    start_at, end_at = parse_time(start), parse_time(end)
    if end_at <= start_at:
        raise click.BadParameter("--to must be after --from", param_hint="--to")
    settings = build_settings(master, mongo_uri, mongo_db, archive_dir)
    out_dir = out_dir or settings.out_dir / (
        f"stats-{start_at:%Y%m%dT%H%M}-{end_at:%Y%m%dT%H%M}")
    progress = Progress()
    progress.step(f"starting Spark ({settings.master})")
    spark = build_spark(settings)
    with Progress(spark.sparkContext) as progress:
        run = run_stats(spark, settings, start_at, end_at, source=source,  # type: ignore[arg-type]
                        out_dir=out_dir, progress=progress)
    click.echo(f"report: {run.report}")
    click.echo(f"tables: {run.parquet_dir}")


@analytics.command()
@click.option("--before", required=True,
              help="Archive messages created before this time (ISO 8601, UTC).")
@spark_options
@analytics_errors
def archive(before: str, master: str | None, mongo_uri: str | None, mongo_db: str | None,
            archive_dir: Path | None) -> None:
    """Export old messages and their traces to Parquet, verify, then mark them archived (the
    TTL index then removes them after MSGBUS_ANALYTICS_RETENTION_AFTER_ARCHIVE_S)."""
    from analytics.archive import run_archive
    from analytics.progress import Progress
    from analytics.session import build_spark

    settings = build_settings(master, mongo_uri, mongo_db, archive_dir)
    Progress().step(f"starting Spark ({settings.master})")
    spark = build_spark(settings)
    with Progress(spark.sparkContext) as progress:
        result = run_archive(spark, settings, parse_time(before), progress)
    click.echo(json.dumps({"before": result.before.isoformat(), "archived": result.archived,
                           "written": result.written,
                           "waiting_messages": result.waiting_messages}))


@analytics.command()
@click.option("--message-id", help="The message's id.")
@click.option("--biz-id", help="Every archived message of this business key (newest first).")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a timeline.")
@spark_options
@analytics_errors
def trace(message_id: str | None, biz_id: str | None, as_json: bool, master: str | None,
          mongo_uri: str | None, mongo_db: str | None, archive_dir: Path | None) -> None:
    """Find a message and its timeline in the archive."""
    from analytics.session import build_spark
    from analytics.trace import find_traces, format_trace

    if (message_id is None) == (biz_id is None):
        raise click.UsageError("give --message-id or --biz-id")
    settings = build_settings(master, mongo_uri, mongo_db, archive_dir)
    spark = build_spark(settings)
    traces = find_traces(spark, settings.archive_dir, message_id=message_id, biz_id=biz_id)
    if as_json:
        click.echo(json.dumps([{"message": _plain(t.message), "deliveries": _plain(t.deliveries),
                                "attempts": _plain(t.attempts)} for t in traces]))
        return
    click.echo("\n\n".join(format_trace(t) for t in traces))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):  # a body: text when it is
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return bytes(value).hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
