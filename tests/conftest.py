"""Shared pytest fixtures.

Real servers (devtools/msgbus_devtools/servers.py) start once per session on free ports and
are stopped by PID at the end. A server that cannot start skips the tests that need it, or
fails them when CI=true.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import pytest
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.env import set_test_bus_env

if TYPE_CHECKING:
    from msgbus_devtools.testkit.deployment import Servers

set_test_bus_env()  # pushes to loopback (the subscribers), the key that seals secrets

# ---- real services: tansu (Kafka), SecantusDB (MongoDB), RabbitMQ --------------------------------

T = TypeVar("T")


def _give_up(error: services.ServiceError) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and a real service is unavailable: {error}", pytrace=False)
    pytest.skip(f"real service unavailable: {error}")


def _start_or_give_up(start: Callable[[], T]) -> T:
    try:
        return start()
    except services.ServiceError as exc:
        error = exc
    _give_up(error)  # outside the except block: no "during handling..." noise in the report


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Logs and data of the servers this session starts."""
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def kafka_bootstrap(services_dir: Path) -> Iterator[str]:
    """Bootstrap address, "127.0.0.1:PORT", of a fresh tansu broker (in-memory storage)."""
    tansu = _start_or_give_up(lambda: services.start_tansu(services.free_port(), services_dir))
    yield tansu.url
    tansu.stop()


@pytest.fixture(scope="session")
def mongo_uri(services_dir: Path) -> Iterator[str]:
    """mongodb:// URI of a fresh SecantusDB; use `mongo_db_name` for a database of your own."""
    secantus = _start_or_give_up(
        lambda: services.start_secantus(
            services.free_port(), services_dir / "mongo-data", services_dir
        )
    )
    yield secantus.url
    secantus.stop()


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """amqp:// URL of the machine's RabbitMQ (started, and stopped at the end, if it was down)."""
    rabbit = _start_or_give_up(services.ensure_rabbitmq)
    yield rabbit.url
    if rabbit.started_by_us:
        services.stop_rabbitmq()


@pytest.fixture(scope="session")
def _private_servers_of_the_session(tmp_path_factory: pytest.TempPathFactory
                                    ) -> Iterator[Servers]:
    from msgbus_devtools.testkit.deployment import start_servers  # only the modules that need them

    started = _start_or_give_up(
        lambda: start_servers(tmp_path_factory.mktemp("private-servers")))
    yield started
    started.close()


@pytest.fixture
def private_servers(_private_servers_of_the_session: Servers) -> Servers:
    """Servers the tests stop and restart, never the session's shared ones: SecantusDB, tansu
    on moto's S3 and a RabbitMQ node (devtools/msgbus_devtools/testkit/deployment.py). Started
    once (~7 s), for the serial pass's tests one after the other; what a test before left
    stopped is started again. Every deployment has a database and destinations of its own."""
    _private_servers_of_the_session.restart_stopped()
    return _private_servers_of_the_session


@pytest.fixture
def mongo_db_name() -> str:
    """A database name no other test uses, so tests never share MongoDB state."""
    return f"test_{uuid.uuid4().hex[:16]}"


# ---- more shared fixtures below ------------------------------------------------------------------
