"""validate=True: send() checks a message against its destination's payload schema (fetched
from the receiver, kept for schema_ttl_s) and raises before anything is spooled."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from client_testkit import API_KEY, FAST, StubReceiver, eventually, free_port

from msgbus_client import AsyncMsgbusClient, MsgbusClient, SchemaValidationError

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "string"},
                   "lines": {"type": "array", "items": {"required": ["sku"]}}},
    "required": ["id"],
}


def test_a_message_the_schema_refuses_raises_before_it_is_spooled(
        receiver: StubReceiver, make_client: Callable[..., MsgbusClient]) -> None:
    receiver.set_schema("orders", 3, SCHEMA)
    client = make_client(receiver.url, validate=True)
    with pytest.raises(SchemaValidationError) as raised:
        client.send("orders", {"id": "a", "lines": [{"sku": "x"}, {"qty": 1}]})
    error = raised.value
    assert isinstance(error, ValueError)
    assert (error.destination, error.pointer, error.keyword, error.version) == (
        "orders", "/lines/1", "required", 3)
    assert "/lines/1" in str(error) and "version 3" in str(error)
    with pytest.raises(SchemaValidationError, match="send JSON"):
        client.send("orders", b"\x00\x01")
    with pytest.raises(SchemaValidationError) as as_bytes:
        client.send("orders", b'{"id": 1}', content_type="application/json")
    assert as_bytes.value.pointer == "/id"
    assert client.spool.pending_count() == 0 and receiver.received == []

    message_id = client.send("orders", {"id": "a"})
    eventually(lambda: receiver.ids() == [message_id], 5)
    assert receiver.schema_gets == 1  # kept for schema_ttl_s


def test_a_destination_without_a_schema_is_not_checked(
        receiver: StubReceiver, make_client: Callable[..., MsgbusClient]) -> None:
    client = make_client(receiver.url, validate=True)
    client.send("free", {"anything": True})
    client.send("free", b"\x00")
    eventually(lambda: len(receiver.received) == 2, 5)
    assert receiver.schema_gets == 1  # "no schema" is kept too


def test_without_validate_nothing_is_fetched(
        receiver: StubReceiver, make_client: Callable[..., MsgbusClient]) -> None:
    receiver.set_schema("orders", 1, SCHEMA)
    client = make_client(receiver.url)
    client.send("orders", {"no": "id"})  # the receiver decides
    eventually(lambda: len(receiver.received) == 1, 5)
    assert receiver.schema_gets == 0


def test_an_unreachable_receiver_never_makes_send_fail(
        make_client: Callable[..., MsgbusClient]) -> None:
    client = make_client(f"http://127.0.0.1:{free_port()}", validate=True)
    client.send("orders", {"no": "id"})  # spooled: the receiver will check it
    assert client.spool.pending_count() == 1


async def test_the_async_client_validates_too(receiver: StubReceiver, tmp_path: Path) -> None:
    receiver.set_schema("orders", 1, SCHEMA)
    client = AsyncMsgbusClient(receiver.url, API_KEY, spool_dir=tmp_path / "spool", **FAST,
                               validate=True)
    try:
        with pytest.raises(SchemaValidationError) as raised:
            await client.send("orders", {"id": 5})
        assert (raised.value.pointer, raised.value.keyword) == ("/id", "type")
        await client.send("orders", {"id": "5"})
    finally:
        await client.close()
    assert len(receiver.received) == 1
