"""The running bus (receiver, dispatcher, compensator, admin in-process) for integration tests.

One bus per session, configured with real Kafka (tansu), RabbitMQ and a MongoDB-protocol
server; tests isolate themselves with destinations and subscriptions of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from msgbus_devtools.testkit.bus import RunningBus, running_bus

from msgbus.store import MongoStore


@pytest.fixture(scope="session")
def bus(mongo_uri: str, kafka_bootstrap: str, rabbitmq_url: str,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBus]:
    with running_bus(mongo_uri, tmp_path_factory.mktemp("bus-state"), "e2e",
                     kafka_bootstrap=kafka_bootstrap, rabbitmq_url=rabbitmq_url) as running:
        yield running


@pytest.fixture(scope="session")
def api_key(bus: RunningBus) -> str:
    return bus.create_app("tests")


@pytest.fixture
async def store(mongo_uri: str, mongo_db_name: str) -> AsyncIterator[MongoStore]:
    """A `MongoStore` on a database of this test's own, with the bus's indexes."""
    s = MongoStore(mongo_uri, mongo_db_name)
    await s.ensure_indexes()
    yield s
    await s.close()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for destination and subscription names."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def destination(bus: RunningBus, unique: str) -> str:
    """A fresh destination on the direct path."""
    code = f"dest-{unique}"
    bus.create_destination(code, "direct")
    return code


@pytest.fixture
def http(bus: RunningBus, api_key: str) -> Iterator[httpx.Client]:
    """An HTTP client of the receiver, authenticated as the test producer app."""
    with httpx.Client(base_url=bus.receiver_url, timeout=10,
                      headers={"authorization": f"Bearer {api_key}"}) as client:
        yield client
