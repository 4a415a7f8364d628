"""Odd input gets a clear 4xx (never a 5xx), a full buffer a 503 with Retry-After, and a message
sent raw (its own body and Content-Type, attributes in headers) reaches subscribers as sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
from msgbus_devtools.testkit.bus import HOST, RunningBus
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus.serving import ServerGroup, make_server
from msgbus.settings import ReceiverSettings
from receiver.app import create_app
from receiver.service import ReceiverService


def _valid() -> dict[str, object]:
    return {"message_id": uuid7(), "body": {"ok": True}}


def _json_bytes(text: str) -> dict[str, object]:
    return {"content": text.encode(), "headers": {"content-type": "application/json"}}


def _with_body(body_json: str) -> dict[str, object]:
    """A request whose message body is this JSON text, as it is (no Python round trip)."""
    return _json_bytes(f'{{"message_id": "{uuid7()}", "body": {body_json}}}')


CASES: dict[str, tuple[dict[str, object], int, str, str | None]] = {
    # case: (request, status, error, field)
    "body nested deeper than orjson writes": (
        {"json": {**_valid(), "body": json.loads("[" * 300 + "]" * 300)}},
        422, "invalid_message", "body"),
    "document nested deeper than orjson reads": (
        _json_bytes("[" * 2000 + "]" * 2000), 400, "invalid_input", None),
    "integer beyond 64 bits": (
        _with_body("123456789012345678901234567890"),
        422, "invalid_message", "body"),
    "number beyond a double": (
        _with_body("1e400"),
        400, "invalid_input", None),
    "invalid UTF-8": (
        {"content": b'{"message_id": "\xff"}', "headers": {"content-type": "application/json"}},
        400, "invalid_input", None),
    "a lone surrogate": (
        _with_body('"\\ud800"'),
        400, "invalid_input", None),
    "wrong content type": (
        {"content": b"hello", "headers": {"content-type": "text/plain"}},
        415, "unsupported_media_type", "content-type"),
    "UUIDv4 message_id": (
        {"json": {"message_id": "0b6c8d4e-1f2a-4b3c-8d4e-5f6a7b8c9d0e", "body": 1}},
        422, "invalid_message", "message_id"),
    "headers with a number": (
        {"json": {**_valid(), "headers": {"a": 1}}}, 422, "invalid_message", "headers"),
    "headers with a newline": (
        {"json": {**_valid(), "headers": {"trace": "a\r\nx-evil: 1"}}},
        422, "invalid_message", "headers"),
    "header name with a space": (
        {"json": {**_valid(), "headers": {"a b": "c"}}}, 422, "invalid_message", "headers"),
    "biz_id too long": (
        {"json": {**_valid(), "biz_id": "x" * 257}}, 422, "invalid_message", "biz_id"),
    "biz_id with a newline": (
        {"json": {**_valid(), "biz_id": "order\n42"}}, 422, "invalid_message", "biz_id"),
    "created_at out of range": (
        {"json": {**_valid(), "created_at": "0001-01-01T00:00:00+01:00"}},
        422, "invalid_message", "created_at"),
    "content_type with a newline": (
        {"json": {"message_id": uuid7(), "body_base64": "", "content_type": "a/b\nc: d"}},
        422, "invalid_message", "content_type"),
    "a raw-form header beside an envelope": (
        {"json": _valid(), "headers": {"ce-id": uuid7()}}, 422, "invalid_message", "ce-id"),
    "a raw body without ce-id": (
        {"content": b"\x89PNG", "headers": {"content-type": "image/png"}},
        415, "unsupported_media_type", "content-type"),
    "a raw body with a bad ce-id": (
        {"content": b"\x89PNG", "headers": {"content-type": "image/png", "ce-id": "42"}},
        422, "invalid_message", "ce-id"),
    "a raw body with a bad ce-bizid": (
        {"content": b"\x89PNG", "headers": {"content-type": "image/png", "ce-id": uuid7(),
                                            "ce-bizid": b"\xff\xfe"}},
        422, "invalid_message", "ce-bizid"),
    "a chunked body over the limit": (
        {"content": iter([b"x" * 1024 * 1024] * 4), "headers": {"content-type": "image/png",
                                                                 "ce-id": uuid7()}},
        413, "message_too_large", None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_odd_input_gets_a_clear_4xx(http: httpx.Client, destination: str, case: str) -> None:
    request, status, error, field = CASES[case]
    url = f"/v1/destinations/{destination}/messages"
    response = http.post(url, **request)  # type: ignore[arg-type]
    assert response.status_code == status, response.text
    body = response.json()
    assert (body["error"], body.get("field")) == (error, field), body
    assert body["message"]


@pytest.mark.parametrize("code", ["Orders", "a%20b", "x" * 101, "a%00b", "%E8%AE%A2%E5%8D%95"])
def test_destination_codes_that_cannot_exist_are_404(http: httpx.Client, code: str) -> None:
    response = http.post(f"/v1/destinations/{code}/messages", json=_valid())
    assert response.status_code == 404, response.text
    assert response.json()["field"] == "destination"
    batch = http.post("/v1/messages", json={"messages": [
        {**_valid(), "destination": httpx.URL(f"/{code}").path[1:]}]})
    assert batch.json()["results"][0]["status"] == 404


def test_batch_results_never_echo_anything_but_a_short_string_id(
        http: httpx.Client, destination: str) -> None:
    nested = json.loads("[" * 200 + "]" * 200)
    response = http.post("/v1/messages", json={"messages": [
        {"destination": destination, "message_id": nested, "body": 1},
        {"destination": destination, "message_id": "x" * 1000, "body": 1},
        {"destination": {"a": 1}, "message_id": "42", "body": 1}, 7]})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [(r["message_id"], r["status"]) for r in results] == [
        (None, 422), (None, 422), ("42", 422), (None, 422)]
    assert results[2]["error"]["field"] == "destination"


def test_a_raw_message_reaches_subscribers_as_sent(bus: RunningBus, http: httpx.Client,
                                                   destination: str) -> None:
    subscriber = bus.subscribe_recorder(destination, "raw")
    message_id, png = uuid7(), b"\x89PNG\r\n\x1a\n\x00\xff"
    response = http.post(f"/v1/destinations/{destination}/messages", content=png, headers={
        "content-type": "image/png", "ce-id": message_id, "ce-bizid": "订单-42".encode(),
        "ce-time": "2026-01-02T03:04:05.678Z", "x-msgbus-trace": "t-1"})
    assert response.status_code == 202, response.text
    assert response.json() == {"message_id": message_id, "status": "accepted"}
    eventually(lambda: message_id in subscriber.message_ids(), 20, "the raw message")
    [push] = subscriber.pushes
    assert push.body == png
    assert push.headers["content-type"] == "image/png"
    assert unquote(push.headers["ce-bizid"]) == "订单-42"  # percent-encoded, as CloudEvents has it
    assert datetime.fromisoformat(push.headers["ce-time"]) == datetime(
        2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    assert push.headers["x-msgbus-trace"] == "t-1"


@pytest.fixture(scope="module")
def full_receiver(bus: RunningBus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second receiver whose buffer is always full (its limit is 0 bytes)."""
    connections = bus.connections.model_copy(update={
        "kafka_bootstrap": "", "rabbitmq_url": "",
        "state_dir": Path(tmp_path_factory.mktemp("full-receiver"))})
    service = ReceiverService(ReceiverSettings(port=0, buffer_max_bytes=0, flusher="inline",
                                               dispatcher_url=bus.dispatcher_url,
                                               connections=connections))
    group = ServerGroup()

    async def start() -> int:
        server = await group.start(make_server(create_app(service), HOST, 0), "full-receiver")
        return server.port

    port = bus.loop.run(start())
    yield f"http://{HOST}:{port}"
    bus.loop.run(group.stop())


def test_a_full_buffer_answers_503_with_retry_after(full_receiver: str, api_key: str,
                                                    destination: str) -> None:
    with httpx.Client(base_url=full_receiver, timeout=10,
                      headers={"authorization": f"Bearer {api_key}"}) as http:
        single = http.post(f"/v1/destinations/{destination}/messages", json=_valid())
        batch = http.post("/v1/messages", json={"messages": [
            {**_valid(), "destination": destination}]})
    for response in (single, batch):
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) >= 1
        body = response.json()
        assert body["error"] == "buffer_full"
        assert "buffer is full" in body["message"]
