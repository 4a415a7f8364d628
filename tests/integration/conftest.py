"""The running bus (receiver, dispatcher, compensator, admin in-process) for integration tests.

One bus per session, configured with real Kafka (tansu), RabbitMQ and a MongoDB-protocol
server; tests isolate themselves with destinations and subscriptions of their own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.bus import RunningBus, StartBus, running_bus
from msgbus_devtools.testkit.children import ScriptChildren
from msgbus_devtools.testkit.tcp_gate import TcpGate

from msgbus.store import MongoStore


@pytest.fixture(scope="session")
def start_bus(mongo_uri: str, kafka_bootstrap: str, rabbitmq_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> StartBus:
    """`with start_bus(name, **options) as bus:` a bus of its own on the session's servers: its
    own database (`name` + random) and state dir; `options` go to RunningBus."""

    def start(name: str, **options: Any) -> AbstractContextManager[RunningBus]:
        return running_bus(mongo_uri, tmp_path_factory.mktemp(f"{name}-bus"), name,
                           kafka_bootstrap=kafka_bootstrap, rabbitmq_url=rabbitmq_url, **options)

    return start


@pytest.fixture(scope="module")
def rabbitmq_management(rabbitmq_url: str) -> str:
    """The URL of the machine's RabbitMQ management API (enabled if it was not)."""
    try:
        return services.ensure_rabbitmq_management()
    except services.ServiceError as exc:
        pytest.fail(f"RabbitMQ's management API is unavailable: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def bus(start_bus: StartBus) -> Iterator[RunningBus]:
    with start_bus("e2e") as running:
        yield running


@pytest.fixture(scope="session")
def api_key(bus: RunningBus) -> str:
    return bus.create_app("tests")


@pytest.fixture
def store_class() -> type[MongoStore]:
    """What `store` makes; a module overrides this fixture for a store of its own kind."""
    return MongoStore


@pytest.fixture
async def store(mongo_uri: str, mongo_db_name: str,
                store_class: type[MongoStore]) -> AsyncIterator[MongoStore]:
    """A `store_class` on a database of this test's own, with the bus's indexes."""
    s = store_class(mongo_uri, mongo_db_name)
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
def children() -> Iterator[ScriptChildren]:
    """Starts script children (a producer, a pod) for this test; kills them (-9) after it."""
    with ScriptChildren() as started:
        yield started


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


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def mongo_gate(mongo_uri: str) -> Iterator[TcpGate]:
    """A TcpGate in front of the session's MongoDB server: freeze or close it to cut off (only)
    the clients that connect through it."""
    server = urlsplit(mongo_uri)
    assert server.hostname and server.port
    with TcpGate(server.hostname, server.port) as gate:
        yield gate


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium under Playwright (the admin UI's browser tests)."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
