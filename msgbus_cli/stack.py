"""Building and running the bus's services from settings: the composition root shared by
`msgbus up` (all services in one process) and `msgbus <service>` (one service)."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from pydantic import SecretStr

from msgbus.gcfreeze import freeze_startup_objects
from msgbus.sealing import new_key
from msgbus.serving import EmbeddedServer, ServerGroup, make_server
from msgbus.settings import (
    AdminSettings,
    CompensatorSettings,
    ConnectionSettings,
    DispatcherSettings,
    ReceiverSettings,
)
from msgbus_cli import secrets as stored

INTERNAL_TOKEN_FILE = "internal-token"
SECRET_KEYS_FILE = "secret-keys"  # seals stored secrets (msgbus/sealing.py)
ADMIN_TOKEN_FILE = "admin-token"
SESSION_SECRET_FILE = "admin-session-secret"
# what `msgbus up` leaves for the commands run beside it
CLI_KEY_FILE = "cli-api-key"  # the producer key of `msgbus send`
RECEIVER_URL_FILE = "receiver-url"
ADMIN_URL_FILE = "admin-url"  # what `msgbus replay` / `msgbus parked` talk to


def connection_settings(state_dir: Path | None = None, **overrides: Any) -> ConnectionSettings:
    """Connection settings from the environment; tokens the environment does not set come
    from (or are created in) the state directory so that separate processes agree."""
    conn = ConnectionSettings(**overrides)
    if state_dir is not None:
        conn.state_dir = state_dir
    if not conn.internal_token.get_secret_value():
        conn.internal_token = SecretStr(
            stored.read_or_create(conn.state_dir / INTERNAL_TOKEN_FILE))
    if not conn.secret_keys.get_secret_value() and not conn.secret_key_file:
        path = conn.state_dir / SECRET_KEYS_FILE
        stored.read_or_create(path, lambda: new_key("k1"))
        conn.secret_key_file = str(path)
    return conn


def admin_token(conn: ConnectionSettings) -> SecretStr:
    env = os.environ.get("MSGBUS_ADMIN_TOKEN")
    return SecretStr(env or stored.read_or_create(conn.state_dir / ADMIN_TOKEN_FILE))


@dataclass
class ServiceApps:
    """Which services to run, and their settings."""

    conn: ConnectionSettings
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)

    def receiver(self, dispatcher_url: str | None = None, *, inline_flusher: bool = False) -> Any:
        """`inline_flusher`: flush the buffer on the receiver's own event loop (one process,
        as `msgbus up` runs everything) instead of a flush process."""
        from receiver.app import create_app
        from receiver.service import ReceiverService

        settings = ReceiverSettings(connections=self.conn)
        if dispatcher_url:
            settings.dispatcher_url = dispatcher_url
        if inline_flusher:
            settings.flusher = "inline"
        return create_app(ReceiverService(settings)), settings

    def dispatcher(self) -> Any:
        from dispatcher.app import create_app
        from dispatcher.service import DispatcherService

        settings = DispatcherSettings(connections=self.conn)
        return create_app(DispatcherService(settings)), settings

    def compensator(self) -> Any:
        from compensator.app import create_app
        from compensator.service import CompensatorService

        settings = CompensatorSettings(connections=self.conn)
        return create_app(CompensatorService(settings)), settings

    def admin(self) -> Any:
        from admin.app import create_app
        from admin.service import AdminService

        secret = os.environ.get("MSGBUS_ADMIN_SESSION_SECRET") or stored.read_or_create(
            self.conn.state_dir / SESSION_SECRET_FILE)
        settings = AdminSettings(connections=self.conn, token=admin_token(self.conn),
                                 session_secret=SecretStr(secret))
        return create_app(AdminService(settings)), settings


def stop_on_signals() -> asyncio.Event:
    """An event that Ctrl-C / SIGTERM sets. Call it before starting any server: a server
    answers (e.g. a readiness probe) a moment before `ServerGroup.start` returns, and a
    SIGTERM in that moment would otherwise kill the process with the default action."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve_until_signal(group: ServerGroup, stop: asyncio.Event) -> None:
    """Wait for `stop` (see `stop_on_signals`) or a server exiting by itself, then stop the
    group."""
    freeze_startup_objects()  # every server of the group has started
    stop_wait = asyncio.create_task(stop.wait())
    exit_wait = asyncio.create_task(group.wait_any_exit())
    await asyncio.wait([stop_wait, exit_wait], return_when=asyncio.FIRST_COMPLETED)
    for task in (stop_wait, exit_wait):
        task.cancel()
    click.echo("msgbus: shutting down ...", err=True)
    await group.stop()


def server(app: Any, host: str, port: int) -> EmbeddedServer:
    return make_server(app, host, port, log_level="warning")
