"""Bad input to the receiver gets a 4xx JSON error that names the problem, and the receiver
keeps serving valid messages."""

from __future__ import annotations

import base64

import httpx
import pytest
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7


def _post(http: httpx.Client, destination: str, **kwargs: object) -> httpx.Response:
    return http.post(f"/v1/destinations/{destination}/messages", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("case", "status", "error", "field"), [
    ("unknown destination", 404, "not_found", "destination"),
    ("malformed JSON", 400, "invalid_input", None),
    ("not an object", 422, "invalid_message", None),
    ("missing message_id", 422, "invalid_message", "message_id"),
    ("bad message_id", 422, "invalid_message", "message_id"),
    ("missing body", 422, "invalid_message", "body"),
    ("bad biz_id", 422, "invalid_message", "biz_id"),
    ("bad headers", 422, "invalid_message", "headers"),
    ("bad created_at", 422, "invalid_message", "created_at"),
    ("unknown field", 422, "invalid_message", "colour"),
    ("bad base64", 422, "invalid_message", "body_base64"),
    ("oversized body", 413, "message_too_large", None),
])
def test_bad_input_gets_a_clear_json_error(http: httpx.Client, destination: str, case: str,
                                           status: int, error: str, field: str | None) -> None:
    valid = {"message_id": uuid7(), "body": {"ok": True}}
    requests: dict[str, dict[str, object]] = {
        "unknown destination": {"json": valid},
        "malformed JSON": {"content": b'{"message_id": ', "headers": {"content-type":
                                                                      "application/json"}},
        "not an object": {"json": [1, 2]},
        "missing message_id": {"json": {"body": {}}},
        "bad message_id": {"json": {**valid, "message_id": "42"}},
        "missing body": {"json": {"message_id": uuid7()}},
        "bad biz_id": {"json": {**valid, "biz_id": 7}},
        "bad headers": {"json": {**valid, "headers": {"a": 1}}},
        "bad created_at": {"json": {**valid, "created_at": "yesterday"}},
        "unknown field": {"json": {**valid, "colour": "red"}},
        "bad base64": {"json": {"message_id": uuid7(), "body_base64": "***"}},
        "oversized body": {"json": {"message_id": uuid7(), "body": "x" * (1024 * 1024 + 1)}},
    }
    target = "no-such-destination" if case == "unknown destination" else destination
    response = _post(http, target, **requests[case])
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error
    assert body["message"]
    if field is not None:
        assert body["field"] == field


def test_authentication_is_required(bus: RunningBus, destination: str) -> None:
    message = {"message_id": uuid7(), "body": {}}
    url = f"{bus.receiver_url}/v1/destinations/{destination}/messages"
    missing = httpx.post(url, json=message)
    wrong = httpx.post(url, json=message, headers={"authorization": "Bearer mbk_wrong"})
    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert "Authorization" in missing.json()["message"]


def test_receiver_keeps_serving_after_bad_input(bus: RunningBus, http: httpx.Client,
                                                destination: str) -> None:
    subscriber = bus.subscribe_recorder(destination, "after")
    for _ in range(20):
        assert _post(http, destination, content=b"{nope").status_code == 400
    good = [uuid7(), uuid7()]
    assert _post(http, destination, json={"message_id": good[0], "body": {"a": 1}}
                 ).status_code == 202
    image = base64.b64encode(b"\x89PNG...").decode()
    assert _post(http, destination, json={"message_id": good[1], "body_base64": image,
                                          "content_type": "image/png"}).status_code == 202
    eventually(lambda: subscriber.message_ids() == set(good), 20, "both good messages")
    png = next(p for p in subscriber.pushes if p.message_id == good[1])
    assert png.body == b"\x89PNG..." and png.headers["content-type"] == "image/png"


def test_batch_reports_a_result_per_message(http: httpx.Client, destination: str) -> None:
    ok_id, bad_id = uuid7(), uuid7()
    response = http.post("/v1/messages", json={"messages": [
        {"destination": destination, "message_id": ok_id, "body": 1},
        {"destination": "no-such-destination", "message_id": bad_id, "body": 2},
        {"destination": destination, "message_id": "nope", "body": 3},
    ]})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 404, 422]
    assert results[1]["error"]["field"] == "destination"
    assert results[2]["error"]["field"] == "message_id"
    too_many = http.post("/v1/messages", json={"messages": [
        {"destination": destination, "message_id": uuid7(), "body": i} for i in range(501)]})
    assert too_many.status_code == 413
    assert too_many.json()["error"] == "message_too_large"


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq", "direct"])
def test_a_resent_message_is_accepted_as_duplicate_and_delivered_once(
        bus: RunningBus, http: httpx.Client, unique: str, broker: str) -> None:
    """A client that did not hear the 202 sends the same message again, alone or in a batch:
    the receiver answers "duplicate" and the subscriber gets the message once."""
    code = f"dedupe-{broker}-{unique}"
    bus.create_destination(code, broker)
    subscriber = bus.subscribe_recorder(code, "once", max_concurrency=1)
    message = {"message_id": uuid7(), "biz_id": "k", "body": {"n": 1}}

    first = _post(http, code, json=message)
    again = _post(http, code, json=message)
    batch = http.post("/v1/messages", json={"messages": [
        {**message, "destination": code}, {**message, "destination": code}]})
    assert (first.status_code, first.json()["status"]) == (202, "accepted")
    assert (again.status_code, again.json()["status"]) == (202, "duplicate")
    assert [(r["status"], r.get("duplicate")) for r in batch.json()["results"]] == [
        (202, True), (202, True)]

    # a later message on the same ordered path: once it is delivered, a duplicate would be too
    later = uuid7()
    assert _post(http, code, json={"message_id": later, "biz_id": "k", "body": {"n": 2}}
                 ).json()["status"] == "accepted"
    eventually(lambda: later in subscriber.message_ids(), 30, "the later message")
    assert [p.message_id for p in subscriber.pushes].count(message["message_id"]) == 1
