"""`msgbus up`: the whole bus in one process on embedded defaults.

With no MongoDB configured it starts an embedded MongoDB-protocol server as a child process
(data under the state directory); the server comes from the development tooling
(`msgbus-devtools`, `pip install -e ./devtools`), found through its `msgbus.embedded` entry
point. With no Kafka/RabbitMQ configured destinations use the direct path.
"""

from __future__ import annotations

import asyncio
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

import click

from msgbus import telemetry
from msgbus.auth import hash_api_key, new_api_key
from msgbus.cli import secrets as stored
from msgbus.cli.demo import DEMO_DESTINATION, PrintingSubscriber, register_demo
from msgbus.cli.serving import ServerGroup
from msgbus.cli.stack import (
    ADMIN_URL_FILE,
    CLI_KEY_FILE,
    RECEIVER_URL_FILE,
    ServiceApps,
    connection_settings,
    serve_until_signal,
    server,
    stop_on_signals,
)
from msgbus.cli.users_cmd import ensure_first_admin
from msgbus.settings import ConnectionSettings, TracingSettings
from msgbus.store import MongoStore

CLI_APP = "cli"


class StartedServer(Protocol):
    url: str

    def stop(self, timeout_s: float = ...) -> None: ...


def _embedded_mongo(state_dir: Path) -> StartedServer:
    found = entry_points(group="msgbus.embedded", name="mongo")
    if not found:
        raise click.UsageError(
            "MSGBUS_MONGO_URI is not set and no embedded MongoDB-protocol server is installed: "
            "set MSGBUS_MONGO_URI, or install msgbus-devtools (pip install -e ./devtools)")
    click.echo("msgbus: no MSGBUS_MONGO_URI set; starting an embedded MongoDB-protocol server "
               "(SecantusDB) ...", err=True)
    start = next(iter(found)).load()
    server: StartedServer = start(state_dir)
    return server


async def _ensure_cli_key(store: MongoStore, state_dir: Path) -> None:
    """The producer key `msgbus send` uses, kept in the state dir (only its hash in MongoDB)."""
    key_path = state_dir / CLI_KEY_FILE
    key = key_path.read_text().strip() if key_path.exists() else new_api_key()
    await store.replace_app_keys(CLI_APP, hash_api_key(key), ["*"])
    stored.write(key_path, key)


async def _run(conn: ConnectionSettings, demo: bool, demo_port: int) -> None:
    stop = stop_on_signals()
    apps = ServiceApps(conn)
    group = ServerGroup()
    store = MongoStore(conn.mongo_uri, conn.mongo_db)
    try:
        await store.ensure_indexes()
        await _ensure_cli_key(store, conn.state_dir)
        first_admin_password = await ensure_first_admin(store)
        if demo:
            sub = await group.start(server(PrintingSubscriber(), "127.0.0.1", demo_port), "demo")
            await register_demo(store, conn, f"http://127.0.0.1:{sub.port}/demo")
        urls: dict[str, str] = {}
        dispatcher_app, d_settings = apps.dispatcher()
        await group.start(server(dispatcher_app, d_settings.host, d_settings.port), "dispatcher")
        urls["dispatcher"] = f"http://{d_settings.host}:{d_settings.port}"
        receiver_app, r_settings = apps.receiver(urls["dispatcher"], inline_drainer=True)
        await group.start(server(receiver_app, r_settings.host, r_settings.port), "receiver")
        urls["receiver"] = f"http://{r_settings.host}:{r_settings.port}"
        stored.write(conn.state_dir / RECEIVER_URL_FILE, urls["receiver"])
        for name, make in (("compensator", apps.compensator), ("admin", apps.admin)):
            app, settings = make()
            await group.start(server(app, settings.host, settings.port), name)
            urls[name] = f"http://{settings.host}:{settings.port}"
        stored.write(conn.state_dir / ADMIN_URL_FILE, urls["admin"])
        _print_banner(conn, urls, demo, first_admin_password)
        await serve_until_signal(group, stop)
    finally:
        await group.stop()
        await store.close()


def _print_banner(conn: ConnectionSettings, urls: dict[str, str], demo: bool,
                  first_admin_password: str | None) -> None:
    click.echo(click.style("msgbus is up", fg="green", bold=True))
    for name in ("receiver", "dispatcher", "compensator", "admin"):
        click.echo(f"  {name:<12} {urls[name]}")
    click.echo(f"  {'mongodb':<12} {conn.mongo_uri} (database {conn.mongo_db})")
    click.echo(f"  {'kafka':<12} {conn.kafka_bootstrap or 'not configured'}")
    click.echo(f"  {'rabbitmq':<12} {'configured' if conn.rabbitmq_url else 'not configured'}")
    click.echo(f"  admin token in {conn.state_dir / 'admin-token'}; "
               f"producer key of `msgbus send` in {conn.state_dir / CLI_KEY_FILE}")
    if first_admin_password is not None:
        click.echo(click.style(f"  first admin user: admin / {first_admin_password} "
                               "(shown only this once; log in at the admin URL)", bold=True))
    if demo:
        click.echo(f"  try: msgbus send {DEMO_DESTINATION} '{{\"hello\": 1}}'")
    click.echo("Ctrl-C stops everything.")


def run_up(state_dir: Path, demo: bool, demo_port: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    mongo: StartedServer | None = None
    overrides = {}
    if "MSGBUS_MONGO_URI" not in os.environ:
        mongo = _embedded_mongo(state_dir)
        overrides["mongo_uri"] = mongo.url
    try:
        conn = connection_settings(state_dir, **overrides)
        telemetry.configure(TracingSettings(), "msgbus")
        asyncio.run(_run(conn, demo, demo_port))
    finally:
        if mongo is not None:
            click.echo("msgbus: stopping the embedded MongoDB-protocol server ...", err=True)
            mongo.stop()
        click.echo("msgbus: stopped.", err=True)
