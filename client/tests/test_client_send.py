"""MsgbusClient.send(): what reaches the receiver, and what send() refuses."""

from __future__ import annotations

import base64
import math
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from client_testkit import API_KEY, StubReceiver, eventually

from msgbus_client import (
    ClientClosedError,
    InvalidMessageError,
    MsgbusClient,
    MsgbusClientError,
)

MakeClient = Callable[..., MsgbusClient]
CREATED_AT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_json_message_arrives_with_every_field(
    receiver: StubReceiver, make_client: MakeClient
) -> None:
    client = make_client(receiver.url)
    before = datetime.now(UTC)
    message_id = client.send(
        "orders",
        {"order_id": 42, "items": ["a", "b"], "note": "café"},
        biz_id="order-42",
        headers={"tenant": "t1"},
    )

    # send() made its inline attempt: the message is there and gone from the spool
    [got] = receiver.received
    assert got.destination == "orders"
    assert got.endpoint == "single"
    assert got.authorization == f"Bearer {API_KEY}"
    assert got.doc == {
        "message_id": message_id,
        "biz_id": "order-42",
        "created_at": got.doc["created_at"],
        "headers": {"tenant": "t1"},
        "body": {"order_id": 42, "items": ["a", "b"], "note": "café"},
    }
    assert uuid.UUID(message_id).version == 7
    assert message_id == str(uuid.UUID(message_id))  # lower-case canonical
    assert CREATED_AT.match(got.doc["created_at"])
    created = datetime.strptime(got.doc["created_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert abs((created - before).total_seconds()) < 5
    assert client.spool.pending_count() == 0


def test_bytes_message_is_sent_as_base64_with_content_type(
    receiver: StubReceiver, make_client: MakeClient
) -> None:
    client = make_client(receiver.url)
    png = b"\x89PNG\r\n\x1a\n\x00\xff"
    client.send("images", png, content_type="image/png")
    client.send("blobs", b"raw")

    first, second = receiver.received
    assert base64.b64decode(first.doc["body_base64"]) == png
    assert first.doc["content_type"] == "image/png"
    assert "body" not in first.doc and "biz_id" not in first.doc
    assert second.doc["content_type"] == "application/octet-stream"
    assert base64.b64decode(second.doc["body_base64"]) == b"raw"


def test_message_ids_grow_in_send_order(receiver: StubReceiver, make_client: MakeClient) -> None:
    client = make_client(receiver.url)
    ids = [client.send("orders", i) for i in range(50)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 50
    assert receiver.ids() == ids


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("orders", object()), {}),
        (("orders", {"x": {1, 2}}), {}),
        (("orders", math.nan), {}),
        (("orders", {"s": "\ud800"}), {}),
        (("orders", {"a": 1}), {"content_type": "text/plain"}),
        (("orders", {"a": 1}), {"biz_id": 42}),
        (("orders", {"a": 1}), {"headers": {"k": 1}}),
        (("", {"a": 1}), {}),
        (("a/b", {"a": 1}), {}),
        ((None, {"a": 1}), {}),
    ],
)
def test_bad_input_raises_at_once_and_spools_nothing(
    receiver: StubReceiver,
    make_client: MakeClient,
    args: tuple[object, ...],
    kwargs: dict[str, object],
) -> None:
    client = make_client(receiver.url)
    with pytest.raises((TypeError, ValueError)) as caught:
        client.send(*args, **kwargs)  # type: ignore[arg-type]
    assert isinstance(caught.value, InvalidMessageError)
    assert isinstance(caught.value, MsgbusClientError)
    assert client.spool.pending_count() == 0
    assert client.spool.used_bytes == 0
    assert receiver.attempts == []


def test_circular_structure_is_refused(receiver: StubReceiver, make_client: MakeClient) -> None:
    client = make_client(receiver.url)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError):
        client.send("orders", loop)
    assert client.spool.pending_count() == 0


def test_wrong_api_key_keeps_messages_instead_of_rejecting_them(
    receiver: StubReceiver, make_client: MakeClient, spool_dir: Path
) -> None:
    client = make_client(receiver.url, api_key="wrong-key")
    message_id = client.send("orders", {"n": 1})
    assert receiver.received == []
    assert client.spool.pending_count() == 1
    assert client.spool.rejected_count() == 0
    assert client.close(timeout_s=0) == 1

    # fixed configuration: the next process delivers what the first one kept
    fixed = make_client(receiver.url)
    eventually(lambda: receiver.ids() == [message_id])
    eventually(lambda: fixed.spool.pending_count() == 0)


def test_context_manager_closes_and_frees_the_spool_dir(
    receiver: StubReceiver, spool_dir: Path
) -> None:
    with MsgbusClient(receiver.url, API_KEY, spool_dir=spool_dir) as client:
        client.send("orders", 1)
    with pytest.raises(ClientClosedError):
        client.send("orders", 2)
    with MsgbusClient(receiver.url, API_KEY, spool_dir=spool_dir) as again:  # lock released
        again.send("orders", 3)
    assert [r.doc["body"] for r in receiver.received] == [1, 3]


def test_api_key_never_appears_in_logs(
    receiver: StubReceiver, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="msgbus_client")
    caplog.set_level("DEBUG", logger="httpx")
    client = make_client(receiver.url, api_key="secret-key-xyz")
    client.send("orders", 1)  # 401: kept and logged
    client.close(timeout_s=0.2)
    assert "HTTP 401" in caplog.text
    assert "secret-key-xyz" not in caplog.text
    assert "secret-key-xyz" not in repr(client.settings)
