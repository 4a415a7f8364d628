"""Messages the receiver refuses as invalid move to the spool's `rejected` list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from client_testkit import StubReceiver, eventually, free_port

from msgbus_client import MsgbusClient

MakeClient = Callable[..., MsgbusClient]
INVALID = {"error": "invalid_body", "message": "amount must be positive", "field": "amount"}


def refuse_negative(destination: str, doc: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    body = doc.get("body")
    if isinstance(body, dict) and body.get("amount", 0) < 0:
        return 422, INVALID
    return None


def test_invalid_message_is_rejected_then_resent_or_purged(
    receiver: StubReceiver, make_client: MakeClient, caplog: Any
) -> None:
    receiver.set_rule(refuse_negative)
    client = make_client(receiver.url)
    bad = client.send("payments", {"amount": -5}, biz_id="p-1")
    good = client.send("payments", {"amount": 5})

    assert receiver.ids() == [good]
    assert client.spool.pending_count() == 0
    [rejected] = client.spool.list_rejected()
    assert rejected.message_id == bad
    assert rejected.destination == "payments"
    assert rejected.status == 422
    assert rejected.error == INVALID
    assert rejected.message["body"] == {"amount": -5}
    assert rejected.message["biz_id"] == "p-1"
    assert bad in caplog.text and "422" in caplog.text

    # the receiver's rules changed: send it again, same id
    receiver.set_rule(None)
    assert client.spool.resend_rejected(bad)
    eventually(lambda: receiver.ids() == [good, bad])
    eventually(lambda: client.spool.pending_count() == 0)
    assert client.spool.list_rejected() == []
    assert not client.spool.resend_rejected(bad)

    # purge
    receiver.set_rule(refuse_negative)
    client.send("payments", {"amount": -1})
    client.send("payments", {"amount": -2})
    assert client.spool.rejected_count() == 2
    used = client.spool.used_bytes
    assert client.spool.purge_rejected() == 2
    assert client.spool.rejected_count() == 0
    assert client.spool.used_bytes < used


def test_unknown_destination_404_is_rejected(
    receiver: StubReceiver, make_client: MakeClient
) -> None:
    receiver.set_rule(
        lambda dest, doc: (404, {"error": "unknown_destination"}) if dest == "nope" else None
    )
    client = make_client(receiver.url)
    message_id = client.send("nope", {"a": 1})
    [rejected] = client.list_rejected()
    assert (rejected.message_id, rejected.status) == (message_id, 404)
    assert client.purge_rejected(message_id) == 1
    assert client.list_rejected() == []


def test_batch_with_one_invalid_message(make_client: MakeClient) -> None:
    down = StubReceiver(port=free_port())
    down.set_rule(refuse_negative)
    client = make_client(down.url)
    ids = [client.send("payments", {"amount": a}) for a in (1, -1, 2, 3)]
    down.start()
    try:
        eventually(lambda: client.spool.pending_count() == 0)
        assert down.ids() == [ids[0], ids[2], ids[3]]
        assert [r.message_id for r in client.spool.list_rejected()] == [ids[1]]
        assert any(a.endpoint == "batch" for a in down.attempts)
    finally:
        down.stop()
