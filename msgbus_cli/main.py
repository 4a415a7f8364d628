"""The `msgbus` command."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path

import click
import orjson

from msgbus import telemetry
from msgbus.processes import pid_alive
from msgbus.serving import ServerGroup, reuse_port_socket
from msgbus.settings import TracingSettings
from msgbus_cli.access_cmd import (
    USERS_API_COMMANDS,
    apps,
    audit,
    break_glass,
    tokens,
    whoami,
)
from msgbus_cli.aliases import former_name
from msgbus_cli.analytics_cmd import analytics
from msgbus_cli.config_cmd import destination, subscription
from msgbus_cli.keys_cmd import secrets_group
from msgbus_cli.messages_cmd import invalid_docs, messages, runtime
from msgbus_cli.node_rescuer_cmd import node_rescuer
from msgbus_cli.ops_cmd import parked, replay, scheduled
from msgbus_cli.requests_cmd import requests
from msgbus_cli.spool_cmd import spool
from msgbus_cli.stack import (
    ServiceApps,
    connection_settings,
    serve_until_signal,
    server,
    stop_on_signals,
)
from msgbus_cli.status_cmd import status
from msgbus_cli.teams_cmd import teams
from msgbus_cli.users_cmd import users

DEFAULT_STATE_DIR = Path(".msgbus")
STATE_DIR = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path),
    default=lambda: os.environ.get("MSGBUS_STATE_DIR", str(DEFAULT_STATE_DIR)),
    show_default=".msgbus", help="Local state: buffers, embedded MongoDB data, keys, logs.")


class CommandsWithInstalled(click.Group):
    """The bus's commands, and those other packages add (`msgbus services`, from
    msgbus-devtools), found by their `msgbus.commands` entry points: loaded only when named,
    never imported by the bus or at every start of a service."""

    entry_point_group = "msgbus.commands"

    def list_commands(self, ctx: click.Context) -> list[str]:
        installed = {point.name for point in entry_points(group=self.entry_point_group)}
        return sorted({*super().list_commands(ctx), *installed})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None:
            for point in entry_points(group=self.entry_point_group, name=cmd_name):
                command: click.Command = point.load()
                return command
        return found


@click.group(cls=CommandsWithInstalled)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """msgbus: an HTTP message bus gateway."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
                        stream=sys.stderr)
    for noisy in ("pymongo", "httpx", "aiohttp.access", "pika", "msgbus_client"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@main.command()
@STATE_DIR
@click.option("--demo", is_flag=True, help="Add a 'demo' destination with a printing subscriber.")
@click.option("--demo-port", default=8084, show_default=True, help="Port of the demo subscriber.")
def up(state_dir: Path, demo: bool, demo_port: int) -> None:
    """Run the whole bus (receiver, dispatcher, compensator, admin) on embedded defaults."""
    from msgbus_cli.up import run_up

    run_up(state_dir, demo, demo_port)


@main.command()
@STATE_DIR
@click.argument("destination")
@click.argument("message")
@click.option("--biz-id", help="Business key (e.g. an order id) for queries and ordering.")
@click.option("--delay-s", type=click.FloatRange(0, 30 * 24 * 3600),
              help="Push it to no subscriber sooner than this many seconds from now.")
@click.option("--deliver-at", type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"]),
              help="Push it to no subscriber before this time (ISO 8601; UTC without a zone).")
@click.option("--receiver", "receiver_url", envvar="MSGBUS_RECEIVER_URL",
              help="Receiver URL (default: the one `msgbus up` wrote to the state dir).")
@click.option("--api-key", envvar="MSGBUS_API_KEY",
              help="Producer API key (default: the key `msgbus up` created for the CLI).")
@click.option("--timeout", "timeout_s", default=10.0, show_default=True,
              help="Seconds to wait for the receiver before leaving the message spooled.")
def send(state_dir: Path, destination: str, message: str, biz_id: str | None,
         delay_s: float | None, deliver_at: datetime | None, receiver_url: str | None,
         api_key: str | None, timeout_s: float) -> None:
    """Send MESSAGE (JSON) to DESTINATION through the durable client."""
    from msgbus_client import MsgbusClient

    from msgbus_cli.stack import CLI_KEY_FILE, RECEIVER_URL_FILE

    try:
        body = orjson.loads(message)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="MESSAGE") from exc
    receiver_url = receiver_url or _from_state(state_dir / RECEIVER_URL_FILE, "--receiver")
    api_key = api_key or _from_state(state_dir / CLI_KEY_FILE, "--api-key")
    if delay_s is not None and deliver_at is not None:
        raise click.UsageError("give --delay-s or --deliver-at, not both")
    if deliver_at is not None and deliver_at.tzinfo is None:
        deliver_at = deliver_at.replace(tzinfo=UTC)
    client = MsgbusClient(receiver_url, api_key, spool_dir=state_dir / "cli-spool")
    message_id = client.send(destination, body, biz_id=biz_id, delay_s=delay_s,
                             deliver_at=deliver_at)
    left = client.close(timeout_s)
    if left:
        click.echo(f"{message_id} spooled; the receiver has not accepted it yet "
                   f"(it is re-sent by the next `msgbus send`)", err=True)
        sys.exit(1)
    click.echo(message_id)


def _from_state(path: Path, option: str) -> str:
    if not path.exists():
        raise click.UsageError(f"{path} not found: run `msgbus up` first or pass {option}")
    return path.read_text().strip()


# Every service hands work between its event loop and threads (the local buffer's writer, the
# Kafka poll threads); at the default 5 ms a thread waited that long for the GIL whenever the
# loop was busy: receiver half-load p50 ~4.5 -> ~3 ms, dispatcher ~600 -> ~1,400 pushes/s here.
SWITCH_INTERVAL_S = 0.0005


def _serve(name: str, state_dir: Path, *, reuse_port: bool = False) -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    apps = ServiceApps(connection_settings(state_dir))
    app, settings = getattr(apps, name)()
    telemetry.configure(TracingSettings(), f"msgbus-{name}")

    async def serve() -> None:
        stop = stop_on_signals()
        group = ServerGroup()
        sockets = [reuse_port_socket(settings.host, settings.port)] if reuse_port else None
        await group.start(server(app, settings.host, settings.port), name, sockets=sockets)
        click.echo(f"msgbus {name} on http://{settings.host}:{settings.port}", err=True)
        await serve_until_signal(group, stop)

    asyncio.run(serve())


def _service_command(name: str) -> click.Command:
    @STATE_DIR
    def run(state_dir: Path) -> None:
        _serve(name, state_dir)

    run.__doc__ = f"Run the {name} alone (settings from MSGBUS_* variables)."
    return click.command(name)(run)


@main.command()
@STATE_DIR
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              envvar="MSGBUS_RECEIVER_WORKERS",
              help="Receiver processes sharing the port (SO_REUSEPORT), each with a buffer slot "
                   "of its own; a worker that dies is restarted.")
@click.option("--reuse-port", is_flag=True, hidden=True,
              help="Listen with SO_REUSEPORT (what each worker of --workers N does).")
def receiver(state_dir: Path, workers: int, reuse_port: bool) -> None:
    """Run the receiver alone (settings from MSGBUS_* variables)."""
    _share_metrics_between_processes()  # its workers and flush processes: before any import
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if workers == 1:
        _serve("receiver", state_dir, reuse_port=reuse_port)
        return
    from msgbus.settings import ReceiverSettings
    from receiver.workers import run_receiver_workers

    connection_settings(state_dir)  # creates the shared token once, before the workers race
    settings = ReceiverSettings()
    sys.exit(run_receiver_workers(state_dir, workers, settings.host, settings.port))


def _share_metrics_between_processes() -> None:
    """Let every process of this receiver (workers, flush processes) report its metrics on the
    /metrics of each: prometheus_client's multiprocess mode, in a directory of this receiver's
    own (a parent's, when this is one of its workers), removed when it exits. Directories that
    receivers killed with -9 left behind (their pid is in the name) are removed here."""
    variable = "PROMETHEUS_MULTIPROC_DIR"
    if "prometheus_client" in sys.modules:
        raise RuntimeError(f"{variable} must be set before prometheus_client is imported")
    if os.environ.get(variable):
        return
    prefix = "msgbus-receiver-metrics-"
    for left in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        owner = left.name[len(prefix):].split("-", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            shutil.rmtree(left, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    os.environ[variable] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)


for _name in ("dispatcher", "compensator", "admin"):
    main.add_command(_service_command(_name))
main.add_command(spool)
main.add_command(node_rescuer)
main.add_command(former_name(node_rescuer, "spool-drainer"))
main.add_command(replay)
main.add_command(parked)
main.add_command(scheduled)
main.add_command(subscription)
main.add_command(destination)
main.add_command(users)
main.add_command(secrets_group)
for _command in USERS_API_COMMANDS:
    users.add_command(_command)
for _command in (whoami, tokens, apps, audit, messages, invalid_docs, runtime, analytics,
                 status, teams, break_glass, requests):
    main.add_command(_command)
