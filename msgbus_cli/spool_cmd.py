"""`msgbus spool ...`: look into client spool dirs, rescue the ones processes left behind, and
deal with messages the receiver rejected.

The work is done by `msgbus_client.spooltools`, the same code the Kubernetes DaemonSet
(`msgbus node-rescuer`) runs to rescue orphaned spools on a node, so the CLI and the DaemonSet
agree on what "orphaned" means. Errors print one line and exit 1. `msgbus spool drain` and
`orphans --drain`, the names before 0.2, still work (hidden).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson
from msgbus_client import MsgbusClientError, Spool
from msgbus_client.spool import RejectedMessage
from msgbus_client.spooltools import (
    DEFAULT_ORPHAN_IDLE_S,
    RescueReport,
    SpoolReport,
    find_orphans,
    find_spools,
    inspect_spool,
    list_rejected,
    open_for_maintenance,
    rescue_spool,
)

from msgbus_cli.aliases import former_name

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar  # what click.progressbar() returns

SPOOL_PATH = click.argument("path", type=click.Path(file_okay=False, path_type=Path))
JSON_OUT = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
RECEIVER = click.option("--receiver", "receiver_url", envvar="MSGBUS_RECEIVER_URL",
                        help="Receiver URL to send the messages to [env MSGBUS_RECEIVER_URL].")
API_KEY = click.option("--api-key", envvar="MSGBUS_API_KEY",
                       help="Producer API key of the application [env MSGBUS_API_KEY].")
TIMEOUT = click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True,
                       help="Seconds to keep trying one spool before leaving the rest in it.")
KEEP = click.option("--keep", is_flag=True, help="Keep the spool dir even when it is empty.")


def min_idle_option(default: float) -> Any:
    return click.option(
        "--min-idle", "min_idle_s", type=float, default=default, show_default=True,
        help="Seconds a spool must be unwritten (and unheld) to count as orphaned.")


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Spool and input errors become `Error: <message>` and exit status 1, no traceback."""
    try:
        yield
    except (MsgbusClientError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def spool() -> None:
    """Inspect, rescue and repair client spool dirs (the LMDB queues of msgbus_client)."""


@spool.command()
@SPOOL_PATH
@JSON_OUT
@min_idle_option(DEFAULT_ORPHAN_IDLE_S)
def inspect(path: Path, as_json: bool, min_idle_s: float) -> None:
    """Show pending and rejected counts, ages and owner of the spool at PATH, or of every spool
    under PATH (up to 3 levels down). Read-only: safe on a spool a live client holds."""
    with one_line_errors():
        paths = find_spools(path)
        if not paths:
            raise click.ClickException(f"no spool dirs in {path} (searched 3 levels down)")
        reports = [inspect_spool(p) for p in paths]
    print_reports(reports, min_idle_s, as_json)


@spool.command()
@SPOOL_PATH
@RECEIVER
@API_KEY
@min_idle_option(0.0)
@TIMEOUT
@KEEP
def rescue(path: Path, receiver_url: str | None, api_key: str | None, min_idle_s: float,
           timeout_s: float, keep: bool) -> None:
    """Send everything pending in the spool at PATH to the receiver, then remove the dir.

    Refused while a live process holds the spool. Rejected messages stay in the dir (see
    `msgbus spool rejected`). Exits 1 if anything is left in the spool.
    """
    url, key = require_target(receiver_url, api_key)
    with one_line_errors():
        report = rescue_with_progress(path, url, key, min_idle_s, timeout_s, keep)
    echo_rescued(report)
    exit_if_left([report])


spool.add_command(former_name(rescue, "drain"))


@spool.command()
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
@min_idle_option(DEFAULT_ORPHAN_IDLE_S)
@click.option("--rescue", "and_rescue", is_flag=True, help="Rescue (and remove) each orphan.")
@click.option("--drain", "and_drain", is_flag=True, hidden=True,
              help="--rescue, under its name before 0.2.")
@RECEIVER
@API_KEY
@TIMEOUT
@KEEP
@JSON_OUT
def orphans(root: Path, min_idle_s: float, and_rescue: bool, and_drain: bool,
            receiver_url: str | None, api_key: str | None, timeout_s: float, keep: bool,
            as_json: bool) -> None:
    """List the orphaned spools under ROOT: no live process holds them and they have not been
    written for --min-idle seconds. With --rescue, send each one's messages and remove it."""
    if and_drain:
        click.echo("DeprecationWarning: --drain is --rescue since 0.2.", err=True)
    target = require_target(receiver_url, api_key) if and_rescue or and_drain else None
    with one_line_errors():
        found = find_orphans(root, min_idle_s)
    if target is None:
        print_reports(found, min_idle_s, as_json)
        return
    rescued: list[RescueReport] = []
    for report in found:  # one spool failing (e.g. its owner came back) does not stop the rest
        try:
            rescued.append(rescue_with_progress(report.path, *target, min_idle_s, timeout_s,
                                                keep))
        except MsgbusClientError as exc:
            click.echo(f"Error: {exc}", err=True)
            continue
        echo_rescued(rescued[-1])
    click.echo(f"{len(rescued)} of {len(found)} orphaned spool(s) rescued under {root}")
    if len(rescued) < len(found):
        sys.exit(1)
    exit_if_left(rescued)


@spool.group()
def rejected() -> None:
    """List, re-send or purge the messages a receiver rejected as invalid."""


@rejected.command("list")
@SPOOL_PATH
@JSON_OUT
def list_command(path: Path, as_json: bool) -> None:
    """List the rejected messages of the spool at PATH (read-only), oldest first."""
    with one_line_errors():
        found = list_rejected(path)
    if as_json:
        click.echo(orjson.dumps([rejected_doc(r) for r in found], option=orjson.OPT_INDENT_2))
        return
    if not found:
        click.echo(f"no rejected messages in {path}")
    for r in found:
        error = orjson.dumps(r.error).decode()
        click.echo(f"{r.message_id}  {r.destination}  HTTP {r.status}  {r.rejected_at}  {error}")


@rejected.command()
@SPOOL_PATH
@click.argument("message_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every rejected message.")
def resend(path: Path, message_ids: tuple[str, ...], all_: bool) -> None:
    """Move rejected messages (MESSAGE_ID... or --all) of the spool at PATH back to pending.

    They go out with `msgbus spool rescue PATH` or the next client on that dir. Needs the spool:
    refused while a live client holds it.
    """
    require_ids(message_ids, all_)
    with one_line_errors(), maintained(path) as spool:
        if all_:
            moved = spool.resend_all_rejected()
        else:
            moved = count_found(path, message_ids, spool.resend_rejected)
    click.echo(f"{moved} message(s) moved back to pending in {path}; "
               f"`msgbus spool rescue {path}` sends them")


@rejected.command()
@SPOOL_PATH
@click.argument("message_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every rejected message.")
def purge(path: Path, message_ids: tuple[str, ...], all_: bool) -> None:
    """Delete rejected messages (MESSAGE_ID... or --all) of the spool at PATH for good.

    Needs the spool: refused while a live client holds it.
    """
    require_ids(message_ids, all_)
    with one_line_errors(), maintained(path) as spool:
        if all_:
            removed = spool.purge_rejected()
        else:
            removed = count_found(path, message_ids, lambda m: spool.purge_rejected(m) > 0)
    click.echo(f"{removed} rejected message(s) purged from {path}")


# -- helpers ------------------------------------------------------------------------------------


def rescue_with_progress(path: Path, receiver_url: str, api_key: str, min_idle_s: float,
                         timeout_s: float, keep: bool) -> RescueReport:
    """rescue_spool() with a progress bar on stderr (stdout keeps the summary). The bar starts
    with the first batch, so a refused rescue prints nothing but its error."""
    with contextlib.ExitStack() as stack:
        bars: list[ProgressBar[int]] = []

        def advance(done: int, total: int) -> None:
            if not bars:
                bars.append(stack.enter_context(click.progressbar(
                    length=max(total, 1), label=f"rescuing {path}", file=sys.stderr,
                    show_pos=True)))
            bars[0].update(done - bars[0].pos)

        return rescue_spool(path, receiver_url, api_key, min_idle_s=min_idle_s,
                            timeout_s=timeout_s, remove=not keep, progress=advance)


@contextlib.contextmanager
def maintained(path: Path) -> Iterator[Spool]:
    spool = open_for_maintenance(path)
    try:
        yield spool
    finally:
        spool.close()


def count_found(path: Path, message_ids: tuple[str, ...], act: Callable[[str], bool]) -> int:
    """Apply `act(message_id) -> bool` to each id; fail naming the ids that were not there."""
    missing = [m for m in message_ids if not act(m)]
    if missing:
        done = len(message_ids) - len(missing)
        raise click.ClickException(f"not rejected in {path}: {', '.join(missing)} "
                                   f"({done} other(s) done)")
    return len(message_ids)


def require_ids(message_ids: tuple[str, ...], all_: bool) -> None:
    if bool(message_ids) == all_:
        raise click.UsageError("give MESSAGE_ID... or --all (not both)")


def require_target(receiver_url: str | None, api_key: str | None) -> tuple[str, str]:
    if not receiver_url:
        raise click.UsageError("--receiver (or MSGBUS_RECEIVER_URL) is required to rescue")
    if not api_key:
        raise click.UsageError("--api-key (or MSGBUS_API_KEY) is required to rescue")
    return receiver_url, api_key


def exit_if_left(reports: list[RescueReport]) -> None:
    if any(r.left or r.rejected for r in reports):
        sys.exit(1)


def echo_rescued(r: RescueReport) -> None:
    fate = "removed" if r.removed else "kept"
    click.echo(f"{r.path}: {r.delivered} delivered, {r.rejected} rejected (kept), "
               f"{r.left} left pending; dir {fate} ({r.seconds:.1f}s)")


def print_reports(reports: list[SpoolReport], min_idle_s: float, as_json: bool) -> None:
    if as_json:
        docs = [report_doc(r, min_idle_s) for r in reports]
        click.echo(orjson.dumps(docs, option=orjson.OPT_INDENT_2))
        return
    if not reports:
        click.echo("no spools to show")
        return
    click.echo(f"{'PENDING':>8} {'REJECTED':>8}  {'OLDEST':>7}  {'WRITTEN':>7}  {'STATE':<34} PATH")
    for r in reports:
        click.echo(f"{r.pending:>8} {r.rejected:>8}  {age(r.oldest_age_s):>7}  "
                   f"{age(r.last_write_age_s):>7}  {state(r, min_idle_s):<34} {r.path}")


def report_doc(report: SpoolReport, min_idle_s: float) -> dict[str, Any]:
    doc = dataclasses.asdict(report)
    doc["path"] = str(report.path)
    doc["orphaned"] = report.orphaned(min_idle_s)
    return doc


def rejected_doc(r: RejectedMessage) -> dict[str, Any]:
    return {"message_id": r.message_id, "destination": r.destination, "status": r.status,
            "error": r.error, "rejected_at": r.rejected_at, "message": r.message}


def state(report: SpoolReport, min_idle_s: float) -> str:
    if report.held_by is not None:
        return f"held by {report.held_by}"
    return "orphaned" if report.orphaned(min_idle_s) else "unheld, written recently"


def age(seconds: float | None) -> str:
    """`-`, `42s`, `3m05s`, `2h03m` or `4d07h`."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
