"""`msgbus services up|down|status`: the real backing servers of a development machine.

tansu (Kafka protocol) and SecantusDB (MongoDB wire protocol) run as background processes whose
pids live in the state dir; RabbitMQ is the machine's own server on 5672.
"""

from __future__ import annotations

from pathlib import Path

import click

from msgbus_devtools import stack as svc

STATE_DIR_OPTION = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=svc.DEFAULT_STATE_DIR,
    show_default=True,
    help="Where pids, ports, logs, the env file and the SecantusDB data live.",
)


def print_states(states: list[svc.ServiceState]) -> None:
    for state in states:
        pid = f"pid {state.pid}" if state.pid else ""
        click.echo(f"{state.name:<9} {'up' if state.up else 'DOWN':<5} {state.address:<40} {pid}")


@click.group()
def services() -> None:
    """Start, stop and inspect tansu, SecantusDB and RabbitMQ on 127.0.0.1."""


@services.command()
@STATE_DIR_OPTION
@click.option("--kafka-port", type=int, default=19092, show_default=True)
@click.option("--mongo-port", type=int, default=27027, show_default=True)
def up(state_dir: Path, kafka_port: int, mongo_port: int) -> None:
    """Start tansu and SecantusDB, ensure RabbitMQ.

    Servers already running from an earlier `up` are reused. Their addresses go to services.env.
    """
    try:
        states = svc.up(state_dir, kafka_port=kafka_port, mongo_port=mongo_port)
    except svc.ServiceError as exc:
        raise click.ClickException(exc.message) from exc
    print_states(states)
    env_file = state_dir / svc.ENV_FILE
    click.echo(f"\naddresses in {env_file}; load them with:  set -a; . {env_file}; set +a")


@services.command()
@STATE_DIR_OPTION
def down(state_dir: Path) -> None:
    """Stop what `up` started.

    RabbitMQ is stopped only if `up` started it.
    """
    try:
        stopped = svc.down(state_dir)
    except svc.ServiceError as exc:
        raise click.ClickException(exc.message) from exc
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing to stop")


@services.command()
@STATE_DIR_OPTION
def status(state_dir: Path) -> None:
    """Show each server up or down; exit 1 if any is down."""
    states = svc.status(state_dir)
    print_states(states)
    if not all(state.up for state in states):
        raise SystemExit(1)
