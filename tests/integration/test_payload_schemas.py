"""Payload schemas on the running bus: versions registered through the admin API (409 for an
incompatible one), the receiver's 422/415 per message and per batch item, the version a
message passed in its trace, and the client refusing a bad message before it is spooled."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from click.testing import CliRunner
from msgbus_client import MsgbusClient, SchemaValidationError
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus_cli.main import main as cli

ORDER: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": "number", "minimum": 0},
        "items": {"type": "array", "items": {
            "type": "object", "properties": {"sku": {"type": "string"}},
            "required": ["sku"]}},
    },
    "required": ["order_id"],
}
VALID = {"order_id": "o-1", "amount": 12.5, "items": [{"sku": "a"}]}


def _put_schema(bus: RunningBus, code: str, schema: Any, **extra: Any) -> httpx.Response:
    return bus.admin.put(f"/v1/destinations/{code}/schemas", json={"schema": schema, **extra})


def _with_schema(bus: RunningBus, http: httpx.Client, code: str, schema: Any = ORDER) -> int:
    """Registers `schema` on `code`; returns its version once the receiver enforces it."""
    response = _put_schema(bus, code, schema)
    assert response.status_code == 201, response.text
    version = int(response.json()["version"])

    def enforced() -> bool:
        answer = http.get(f"/v1/destinations/{code}/schema")
        return answer.status_code == 200 and answer.json()["version"] == version

    eventually(enforced, 20, f"the receiver to enforce version {version} of {code}")
    return version


def _send(http: httpx.Client, code: str, **message: Any) -> httpx.Response:
    return http.post(f"/v1/destinations/{code}/messages",
                     json={"message_id": uuid7(), **message})


def test_versions_are_kept_and_an_incompatible_one_is_a_409(bus: RunningBus,
                                                           destination: str) -> None:
    first = _put_schema(bus, destination, ORDER)
    assert first.status_code == 201 and first.json()["version"] == 1
    assert first.json()["compatibility"] == "backward"
    optional = ORDER | {"properties": ORDER["properties"] | {"note": {"type": "string"}}}
    assert _put_schema(bus, destination, optional).json()["version"] == 2

    required = optional | {"required": ["order_id", "amount"]}
    refused = _put_schema(bus, destination, required)
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["error"] == "incompatible_schema"
    assert "field `amount` became required" in body["message"]
    assert body["incompatibilities"] == [{"path": "/required", "breaks": ["backward"],
                                          "message": "field `amount` became required"}]
    # under `forward` the same change is allowed; the mode is kept for the next versions
    assert _put_schema(bus, destination, required, compatibility="forward").json()[
        "version"] == 3
    narrowed = required | {"properties": required["properties"] | {
        "note": {"type": "string", "enum": ["a"]}}}
    assert _put_schema(bus, destination, narrowed).json()["compatibility"] == "forward"

    versions = bus.admin.get(f"/v1/destinations/{destination}/schemas").json()
    assert [v["version"] for v in versions] == [1, 2, 3, 4]
    one = bus.admin.get(f"/v1/destinations/{destination}/schemas/1").json()
    assert one["schema"] == ORDER and one["created_by"]
    assert bus.admin.get(f"/v1/destinations/{destination}/schemas/9").status_code == 404


def test_a_schema_that_is_not_valid_json_schema_is_a_422(bus: RunningBus,
                                                        destination: str) -> None:
    response = _put_schema(bus, destination, {"type": "strin"})
    assert response.status_code == 422
    assert response.json()["field"] == "schema"
    draft7 = _put_schema(bus, destination, {"$schema": "http://json-schema.org/draft-07/schema#"})
    assert draft7.status_code == 422 and "2020-12" in draft7.json()["message"]
    assert _put_schema(bus, "no-such-destination", ORDER).status_code == 404


def test_trying_a_body_against_a_version(bus: RunningBus, destination: str) -> None:
    _put_schema(bus, destination, ORDER).raise_for_status()
    url = f"/v1/destinations/{destination}/schemas/1/check"
    assert bus.admin.post(url, json=VALID).json() == {"valid": True, "version": 1}
    answer = bus.admin.post(url, json={"order_id": "o", "amount": -1}).json()
    assert (answer["valid"], answer["pointer"], answer["keyword"]) == (False, "/amount",
                                                                       "minimum")


def test_the_receiver_refuses_an_invalid_body_with_its_pointer_and_rule(
        bus: RunningBus, http: httpx.Client, destination: str) -> None:
    version = _with_schema(bus, http, destination)
    assert _send(http, destination, body=VALID).status_code == 202
    cases = [({"amount": 1}, "", "required"),
             ({"order_id": 7}, "/order_id", "type"),
             ({"order_id": "o", "items": [{"sku": "a"}, {}]}, "/items/1", "required"),
             ({"order_id": "o", "amount": -2}, "/amount", "minimum")]
    for body, pointer, keyword in cases:
        response = _send(http, destination, body=body)
        assert response.status_code == 422, response.text
        error = response.json()
        assert (error["error"], error["pointer"], error["keyword"]) == (
            "schema_violation", pointer, keyword)
        assert error["schema_version"] == version and error["field"] == "body"
    assert bus.receiver_metric("msgbus_messages_rejected_total", destination=destination,
                               reason="schema_violation") == len(cases)


def test_a_body_that_is_not_json_is_a_415_on_a_destination_with_a_schema(
        bus: RunningBus, http: httpx.Client, destination: str) -> None:
    _with_schema(bus, http, destination)
    png = _send(http, destination, body_base64=base64.b64encode(b"\x89PNG").decode(),
                content_type="image/png")
    assert png.status_code == 415 and png.json()["field"] == "content_type"
    raw = http.post(f"/v1/destinations/{destination}/messages", content=b"plain",
                    headers={"content-type": "text/plain", "ce-id": uuid7()})
    assert raw.status_code == 415
    # JSON as bytes is JSON: validated like a body
    as_bytes = base64.b64encode(b'{"order_id": "o-2"}').decode()
    assert _send(http, destination, body_base64=as_bytes,
                 content_type="application/json").status_code == 202
    bad_bytes = base64.b64encode(b'{"order_id": 2}').decode()
    assert _send(http, destination, body_base64=bad_bytes,
                 content_type="application/json").status_code == 422


def test_a_batch_answers_each_item(bus: RunningBus, http: httpx.Client, destination: str,
                                   unique: str) -> None:
    _with_schema(bus, http, destination)
    open_code = f"noschema-{unique}"
    bus.create_destination(open_code, "direct")
    ids = [uuid7() for _ in range(4)]
    response = http.post("/v1/messages", json={"messages": [
        {"destination": destination, "message_id": ids[0], "body": VALID},
        {"destination": destination, "message_id": ids[1], "body": {"order_id": 1}},
        {"destination": destination, "message_id": ids[2], "body_base64": "AA==",
         "content_type": "application/octet-stream"},
        {"destination": open_code, "message_id": ids[3], "body": {"anything": 1}},
    ]})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 422, 415, 202]
    assert [r["message_id"] for r in results] == ids
    assert (results[1]["error"]["pointer"], results[1]["error"]["keyword"]) == (
        "/order_id", "type")


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq"])
def test_a_valid_message_is_delivered_with_its_schema_version_in_the_trace(
        bus: RunningBus, http: httpx.Client, unique: str, broker: str) -> None:
    code = f"schema-{broker}-{unique}"
    bus.create_destination(code, broker)
    subscriber = bus.subscribe_recorder(code, "orders")
    version = _with_schema(bus, http, code)
    accepted = _send(http, code, body=VALID)
    assert accepted.status_code == 202
    message_id = accepted.json()["message_id"]
    refused = _send(http, code, body={"amount": 1})
    assert refused.status_code == 422

    eventually(lambda: message_id in subscriber.message_ids(), 30, "the valid message")
    push = next(p for p in subscriber.pushes if p.message_id == message_id)
    assert orjson.loads(push.body) == VALID

    def traced() -> dict[str, Any] | None:
        answer = bus.admin.get(f"/v1/messages/{message_id}")
        return answer.json() if answer.status_code == 200 else None

    eventually(lambda: traced() is not None, 20, "the message's record")
    timeline = traced()
    assert timeline is not None and timeline["message"]["schema_version"] == version
    assert subscriber.message_ids() == {message_id}  # the refused one went nowhere


def test_the_client_with_validate_raises_before_spooling(
        bus: RunningBus, http: httpx.Client, destination: str, api_key: str,
        tmp_path: Path) -> None:
    version = _with_schema(bus, http, destination)
    with MsgbusClient(bus.receiver_url, api_key, spool_dir=tmp_path / "spool",
                      validate=True) as client:
        with pytest.raises(SchemaValidationError) as raised:
            client.send(destination, {"order_id": "o", "items": [{}]})
        assert isinstance(raised.value, ValueError)
        assert (raised.value.pointer, raised.value.keyword, raised.value.version) == (
            "/items/0", "required", version)
        assert "/items/0" in str(raised.value)
        with pytest.raises(SchemaValidationError, match="send JSON"):
            client.send(destination, b"\x89PNG", content_type="image/png")
        assert client.spool.pending_count() == 0 and client.list_rejected() == []
        client.send(destination, VALID)
        eventually(lambda: client.spool.pending_count() == 0, 20, "the valid message sent")
        assert client.list_rejected() == []


def test_the_cli_puts_lists_and_shows_versions(bus: RunningBus, destination: str,
                                               tmp_path: Path) -> None:
    admin = ["--admin", bus.admin_url, "--token", bus.admin_token]
    runner = CliRunner()

    def schema(*args: str) -> Any:
        return runner.invoke(cli, ["destination", "schema", args[0], *admin, *args[1:]])

    first, second = tmp_path / "v1.json", tmp_path / "v2.json"
    first.write_bytes(orjson.dumps(ORDER))
    second.write_bytes(orjson.dumps(ORDER | {"required": ["order_id", "amount"]}))
    put = schema("put", destination, str(first))
    assert put.exit_code == 0, put.output
    assert f"{destination}: version 1 registered (backward)" in put.output
    refused = schema("put", destination, str(second))
    assert refused.exit_code == 1 and "409" in refused.output
    assert "/required: field `amount` became required (breaks backward)" in refused.output
    assert schema("put", destination, str(second), "--compatibility", "none").exit_code == 0

    listed = schema("list", destination)
    assert listed.exit_code == 0
    assert [line.split()[:2] for line in listed.output.splitlines()[1:]] == [
        ["1", "backward"], ["2", "none"]]
    as_json = orjson.loads(schema("list", destination, "--json").output)
    assert [v["version"] for v in as_json] == [1, 2]
    assert orjson.loads(schema("show", destination, "1").output) == ORDER
    assert orjson.loads(schema("show", destination).output)["required"] == [
        "order_id", "amount"]
    assert orjson.loads(schema("show", destination, "--json").output)["version"] == 2


def test_a_stored_version_that_does_not_validate_is_listed_and_skipped(
        bus: RunningBus, http: httpx.Client, destination: str) -> None:
    """A version edited by hand into something unreadable: the admin lists it with the other
    invalid configuration, and the receiver goes on validating against the last good one."""
    version = _with_schema(bus, http, destination)
    broken_id = f"{destination}/{version + 1}"
    bus.query(bus.store.db["schemas"].insert_one({
        "_id": broken_id, "destination": destination, "version": version + 1,
        "schema_json": "{not json"}))
    listed = bus.admin.get("/v1/invalid-documents").json()["documents"]
    assert ("schemas", broken_id) in {(d["collection"], d["id"]) for d in listed}
    bus.wait_for_config()
    assert http.get(f"/v1/destinations/{destination}/schema").json()["version"] == version
    assert _send(http, destination, body={"amount": 1}).status_code == 422
    assert [v["version"] for v in bus.admin.get(
        f"/v1/destinations/{destination}/schemas").json()] == [version]
    assert bus.admin.delete(f"/v1/invalid-documents/schemas/{broken_id}").status_code == 204
