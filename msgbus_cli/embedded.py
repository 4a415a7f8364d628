"""What `msgbus up` runs or finds when the environment configures no server: the embedded
MongoDB- and Kafka-protocol servers (child processes from the development tooling, found
through its `msgbus.embedded` entry points: the product never imports it), and the machine's
RabbitMQ when it answers. Each server is stopped by `EmbeddedServers.stop_all`, newest first."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import click

LOCAL_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


class StartedServer(Protocol):
    url: str
    pid: int

    def stop(self, timeout_s: float = ...) -> None: ...


@dataclass(frozen=True)
class Embedded:
    """One kind of embedded server: its entry point name and what the user is told."""

    entry_point: str
    what: str  # e.g. "MongoDB-protocol server (SecantusDB)"
    variable: str  # the setting that, when set, means "use that one instead"
    note: str  # beside its address in `msgbus up`'s banner


MONGO = Embedded("mongo", "MongoDB-protocol server (SecantusDB)", "MSGBUS_MONGO_URI",
                 "embedded SecantusDB, data in the state dir")
KAFKA = Embedded("kafka", "Kafka-protocol broker (tansu)", "MSGBUS_KAFKA_BOOTSTRAP",
                 "embedded tansu, records in memory")


@dataclass
class EmbeddedServers:
    """The servers this `msgbus up` started, oldest first."""

    started: list[tuple[Embedded, StartedServer]] = field(default_factory=list)

    def start(self, kind: Embedded, state_dir: Path, *, required: bool) -> StartedServer | None:
        """Start `kind`'s server; None (or a usage error when `required`) if the development
        tooling that provides it is not installed."""
        found = entry_points(group="msgbus.embedded", name=kind.entry_point)
        if not found:
            if required:
                raise click.UsageError(
                    f"{kind.variable} is not set and no embedded {kind.what} is installed: "
                    f"set {kind.variable}, or install msgbus-devtools (pip install -e ./devtools)")
            click.echo(f"msgbus: {kind.variable} is not set and no embedded {kind.what} is "
                       "installed (pip install -e ./devtools); going without it", err=True)
            return None
        click.echo(f"msgbus: no {kind.variable} set; starting an embedded {kind.what} ...",
                   err=True)
        start = next(iter(found)).load()
        server: StartedServer = start(state_dir)
        self.started.append((kind, server))
        return server

    def note(self, kind: Embedded) -> str:
        """`(embedded ..., pid N)` if this started `kind`'s server, else ``."""
        pids = [server.pid for started, server in self.started if started is kind]
        return f" ({kind.note}, pid {pids[0]})" if pids else ""

    def stop_all(self) -> None:
        """Stop every server started here (by its process), the newest first; a failure to
        stop one is reported and does not keep the others running."""
        while self.started:
            kind, server = self.started.pop()
            click.echo(f"msgbus: stopping the embedded {kind.what} (pid {server.pid}) ...",
                       err=True)
            try:
                server.stop()
            except Exception as exc:  # the next server must still be stopped
                click.echo(f"msgbus: could not stop pid {server.pid}: {exc}", err=True)


def kafka_configured() -> bool:
    return bool(os.environ.get("MSGBUS_KAFKA_BOOTSTRAP") or os.environ.get("MSGBUS_KAFKA_CLUSTERS"))


def rabbitmq_configured() -> bool:
    return bool(os.environ.get("MSGBUS_RABBITMQ_URL")
                or os.environ.get("MSGBUS_RABBITMQ_CLUSTERS"))


def rabbitmq_answers(url: str, timeout_s: float = 2.0) -> bool:
    """True if a RabbitMQ at `url` accepts a connection with the URL's credentials."""
    import pika
    from pika.exceptions import AMQPError

    parameters = pika.URLParameters(url)
    parameters.socket_timeout = timeout_s
    parameters.stack_timeout = timeout_s
    parameters.blocked_connection_timeout = timeout_s
    parameters.connection_attempts = 1
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # a refusal here is an answer, not news
    try:
        pika.BlockingConnection(parameters).close()
    except (AMQPError, OSError):
        return False
    return True


def without_password(url: str) -> str:
    """`amqp://guest:guest@host/` -> `amqp://guest:***@host/`: addresses to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))

