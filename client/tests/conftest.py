from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from client_testkit import API_KEY, FAST, StubReceiver

from msgbus_client import MsgbusClient


@pytest.fixture(scope="session")
def receiver_server() -> Iterator[StubReceiver]:
    server = StubReceiver().start()
    yield server
    server.stop()


@pytest.fixture
def receiver(receiver_server: StubReceiver) -> StubReceiver:
    """The session's receiver, reset for this test (accepting everything)."""
    receiver_server.reset()
    return receiver_server


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def make_client(spool_dir: Path) -> Iterator[Callable[..., MsgbusClient]]:
    """Build MsgbusClients with fast test settings; closes them (without flushing) afterwards."""
    clients: list[MsgbusClient] = []

    def make(url: str, **options: Any) -> MsgbusClient:
        kwargs: dict[str, Any] = {"spool_dir": spool_dir, **FAST, **options}
        client = MsgbusClient(url, kwargs.pop("api_key", API_KEY), **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close(timeout_s=0)
