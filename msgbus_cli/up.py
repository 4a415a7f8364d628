"""`msgbus up`: the whole bus in one process on embedded defaults.

With no MongoDB configured it starts an embedded MongoDB-protocol server, and with no Kafka
configured an embedded Kafka-protocol broker, as child processes (data and logs under the state
directory); both come from the development tooling (`msgbus-devtools`, `pip install -e
./devtools`), found through its `msgbus.embedded` entry points (msgbus_cli/embedded.py). The
machine's RabbitMQ is used when it answers. It prints which broker each destination uses, and
Ctrl-C or SIGTERM stops the services, then every server it started.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import click

from msgbus import telemetry
from msgbus.auth import hash_api_key, new_api_key
from msgbus.egress import LOOPBACK_ONLY
from msgbus.models import BrokerKind, RuntimeConfig
from msgbus.serving import ServerGroup
from msgbus.settings import ConnectionSettings, TracingSettings, sealing_keys
from msgbus.store import MongoStore
from msgbus_cli import secrets as stored
from msgbus_cli.demo import DEMO_DESTINATION, PrintingSubscriber, register_demo
from msgbus_cli.embedded import (
    KAFKA,
    LOCAL_RABBITMQ_URL,
    MONGO,
    EmbeddedServers,
    kafka_configured,
    rabbitmq_answers,
    rabbitmq_configured,
    without_password,
)
from msgbus_cli.stack import (
    ADMIN_URL_FILE,
    CLI_KEY_FILE,
    RECEIVER_URL_FILE,
    ServiceApps,
    connection_settings,
    serve_until_signal,
    server,
    stop_on_signals,
)
from msgbus_cli.users_cmd import ensure_first_admin

CLI_APP = "cli"


# The embedded broker answers a fetch only when the fetch wait has passed (decisions.md, "What
# tansu forced"): the product's 500 ms would be most of a demo message's way; one dispatcher's
# consumers on an in-memory broker afford a shorter wait.
EMBEDDED_KAFKA_FETCH_WAIT_MS = "50"


async def _ensure_cli_key(store: MongoStore, state_dir: Path) -> None:
    """The producer key `msgbus send` uses, kept in the state dir (only its hash in MongoDB)."""
    key_path = state_dir / CLI_KEY_FILE
    key = key_path.read_text().strip() if key_path.exists() else new_api_key()
    await store.producers.replace_app_keys(CLI_APP, hash_api_key(key), ["*"])
    stored.write(key_path, key)


async def _run(conn: ConnectionSettings, servers: EmbeddedServers, demo: bool,
               demo_port: int) -> None:
    stop = stop_on_signals()
    apps = ServiceApps(conn)
    group = ServerGroup()
    store = MongoStore(conn.mongo_uri, conn.mongo_db, keys=sealing_keys(conn))
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
        receiver_app, r_settings = apps.receiver(urls["dispatcher"], inline_flusher=True)
        await group.start(server(receiver_app, r_settings.host, r_settings.port), "receiver")
        urls["receiver"] = f"http://{r_settings.host}:{r_settings.port}"
        stored.write(conn.state_dir / RECEIVER_URL_FILE, urls["receiver"])
        for name, make in (("compensator", apps.compensator), ("admin", apps.admin)):
            app, settings = make()
            await group.start(server(app, settings.host, settings.port), name)
            urls[name] = f"http://{settings.host}:{settings.port}"
        stored.write(conn.state_dir / ADMIN_URL_FILE, urls["admin"])
        where = await _destination_brokers(store, conn, urls["dispatcher"])
        _print_banner(conn, servers, urls, where, demo, first_admin_password)
        await serve_until_signal(group, stop)
    finally:
        await group.stop()
        await store.close()


async def _destination_brokers(store: MongoStore, conn: ConnectionSettings,
                              dispatcher_url: str) -> list[tuple[str, str, str]]:
    """(destination, broker, cluster and address) for each destination, as receivers publish
    now."""
    runtime = await store.config.get_runtime()
    return [(d.code, d.broker.value, _where(d.broker, conn, runtime, dispatcher_url))
            for d in sorted(await store.config.list_destinations(), key=lambda d: d.code)]


def _where(kind: BrokerKind, conn: ConnectionSettings, runtime: RuntimeConfig,
           dispatcher_url: str) -> str:
    if kind is BrokerKind.DIRECT:
        return f"HTTP to the dispatcher, {dispatcher_url}"
    clusters = conn.clusters(kind)
    if not clusters:
        return f"{kind.value} not configured: the direct path"
    active = runtime.active_cluster(kind, list(clusters)) or next(iter(clusters))
    return f"cluster {active}, " + ", ".join(without_password(n) for n in clusters[active])


def _print_banner(conn: ConnectionSettings, servers: EmbeddedServers, urls: dict[str, str],
                  where: list[tuple[str, str, str]], demo: bool,
                  first_admin_password: str | None) -> None:
    click.echo(click.style("msgbus is up", fg="green", bold=True))
    for name in ("receiver", "dispatcher", "compensator", "admin"):
        click.echo(f"  {name:<12} {urls[name]}")
    click.echo(f"  {'mongodb':<12} {conn.mongo_uri} (database {conn.mongo_db})"
               f"{servers.note(MONGO)}")
    for kind, note in ((BrokerKind.KAFKA, servers.note(KAFKA)), (BrokerKind.RABBITMQ, "")):
        clusters = conn.clusters(kind)
        nodes = ", ".join(without_password(n) for c in clusters.values() for n in c)
        click.echo(f"  {kind.value:<12} {nodes + note if nodes else 'not configured'}")
    if where:
        width = max(len("destination"), *(len(code) for code, _, _ in where))
        click.echo(f"  {'destination':<{width}}  {'broker':<8}  cluster, address")
        for code, broker, address in where:
            click.echo(f"  {code:<{width}}  {broker:<8}  {address}")
    click.echo(f"  admin token in {conn.state_dir / 'admin-token'}; "
               f"producer key of `msgbus send` in {conn.state_dir / CLI_KEY_FILE}")
    if first_admin_password is not None:
        click.echo(click.style(f"  first admin user: admin / {first_admin_password} "
                               "(shown only this once; log in at the admin URL)", bold=True))
    if demo:
        click.echo(f"  try: msgbus send {DEMO_DESTINATION} '{{\"hello\": 1}}'")
    click.echo("Ctrl-C stops everything.")


def _brokers(state_dir: Path, servers: EmbeddedServers) -> dict[str, Any]:
    """Connection settings for what the environment leaves unset: the embedded servers
    (started here) and the machine's RabbitMQ if it answers."""
    overrides: dict[str, Any] = {}
    if "MSGBUS_MONGO_URI" not in os.environ:
        mongo = servers.start(MONGO, state_dir, required=True)
        if mongo is not None:
            overrides["mongo_uri"] = mongo.url
            # the embedded stand-in scans the whole collection for an index walk
            overrides["mongo_index_skip_scans"] = False
    if not kafka_configured():
        kafka = servers.start(KAFKA, state_dir, required=False)
        if kafka is not None:
            overrides["kafka_bootstrap"] = kafka.url
            os.environ.setdefault("MSGBUS_DISPATCHER_KAFKA_FETCH_WAIT_MS",
                                  EMBEDDED_KAFKA_FETCH_WAIT_MS)
    if not rabbitmq_configured():
        if rabbitmq_answers(LOCAL_RABBITMQ_URL):
            overrides["rabbitmq_url"] = LOCAL_RABBITMQ_URL
        else:
            click.echo("msgbus: no RabbitMQ answers on 127.0.0.1:5672 (guest/guest) and "
                       "MSGBUS_RABBITMQ_URL is not set: going without RabbitMQ", err=True)
    return overrides


def run_up(state_dir: Path, demo: bool, demo_port: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    # pushes may reach loopback only (the demo subscriber) of the internal addresses
    os.environ.setdefault("MSGBUS_PUSH_ALLOW_NETWORKS", LOOPBACK_ONLY)
    servers = EmbeddedServers()
    try:
        conn = connection_settings(state_dir, **_brokers(state_dir, servers))
        telemetry.configure(TracingSettings(), "msgbus")
        asyncio.run(_run(conn, servers, demo, demo_port))
    finally:
        servers.stop_all()
        click.echo("msgbus: stopped.", err=True)
