"""docs/subscribers.md's example subscribers, run as they are (Python, and Node.js with the
npm `cloudevents` SDK from tests/tools), get every kind of push from a real bus: a JSON body, a
binary body that is not UTF-8, a non-ASCII biz_id (percent-encoded, as the CloudEvents HTTP
binding has it), a trace context, pushes signed with two secrets during a rotation, and batch
pushes (a CloudEvents JSON batch, signed once). Each
verifies and parses; a forged push is refused. Beside them, the third-party `standardwebhooks`
and `cloudevents` PyPI packages alone verify and parse every push whose body is text (the
library decodes the body as UTF-8: what docs/subscribers.md says about binary bodies)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_binary_event
from cloudevents.core.formats.json import JSONFormat
from msgbus_devtools.servers import free_port
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.subscriber import BatchSubscriber, RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually
from standardwebhooks import Webhook, WebhookVerificationError

from msgbus.ids import uuid7

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
NODE_MODULES = REPO / "tests" / "tools" / "node_modules"
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BINARY = bytes(range(256))  # not UTF-8
BIZ_ID = "订单 42/ü"


class ExampleSubscriber:
    """One example, run on `port` with the subscription's secret; its JSON lines kept."""

    def __init__(self, command: list[str], port: int, secret: str) -> None:
        self.port = port
        env = {**os.environ, "MSGBUS_SIGNING_SECRET": secret, "NODE_PATH": str(NODE_MODULES)}
        self.proc = subprocess.Popen([*command, str(self.port)], stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.records: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()
        eventually(lambda: any("listening" in r for r in self.records), 30, "the example to listen")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.records.append(json.loads(line))

    def verified(self) -> dict[str, dict[str, Any]]:
        return {r["id"]: r for r in self.records if r.get("verified")}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture(params=["python", "node"])
def example(request: pytest.FixtureRequest, bus: RunningBus,
            unique: str) -> Iterator[tuple[str, str, ExampleSubscriber]]:
    """(destination, subscription name, the example subscribed to it)."""
    destination, name, port = f"examples-{request.param}-{unique}", "example", free_port()
    bus.create_destination(destination, "kafka")
    subscription = bus.subscribe(destination, name, f"http://127.0.0.1:{port}/hook")
    command = ([sys.executable, str(EXAMPLES / "subscriber.py")] if request.param == "python"
               else ["node", str(EXAMPLES / "subscriber.cjs")])
    subscriber = ExampleSubscriber(command, port, subscription["signing_secrets"][0])
    bus.wait_for_workers([f"{destination}/{name}"])
    yield destination, name, subscriber
    subscriber.stop()


def _send(bus: RunningBus, api_key: str, destination: str, **fields: Any) -> str:
    message_id = uuid7()
    answer = httpx.post(f"{bus.receiver_url}/v1/destinations/{destination}/messages",
                        headers={"authorization": f"Bearer {api_key}"},
                        json={"message_id": message_id, **fields})
    assert answer.status_code == 202, answer.text
    return message_id


def _send_every_kind(bus: RunningBus, api_key: str, destination: str) -> dict[str, str]:
    return {
        "json": _send(bus, api_key, destination, body={"order": 1, "name": "Zoë"}),
        "binary": _send(bus, api_key, destination, body_base64=base64.b64encode(BINARY).decode(),
                        content_type="application/x-protobuf", biz_id=BIZ_ID),
        "traced": _send(bus, api_key, destination, body={"order": 2}, traceparent=PARENT),
    }


def test_the_example_subscribers_verify_and_parse_every_kind_of_push(
        bus: RunningBus, api_key: str, example: tuple[str, str, ExampleSubscriber]) -> None:
    destination, name, subscriber = example
    sent = _send_every_kind(bus, api_key, destination)
    eventually(lambda: set(sent.values()) <= set(subscriber.verified()), 30, "the pushes")

    rotated = bus.admin.post(
        f"/v1/destinations/{destination}/subscriptions/{name}/secrets/rotate").json()
    assert len(rotated["signing_secrets"]) == 2  # signed with the new and the old one
    bus.wait_for_config()
    during_rotation = _send(bus, api_key, destination, body={"order": 3})
    eventually(lambda: during_rotation in subscriber.verified(), 30, "the push after rotating")

    got = subscriber.verified()
    assert got[sent["binary"]]["size"] == len(BINARY)
    assert got[sent["binary"]]["bizid"] == BIZ_ID
    assert got[sent["binary"]]["datacontenttype"] == "application/x-protobuf"
    assert got[sent["traced"]]["traceparent"] == PARENT
    assert {r["type"] for r in got.values()} == {destination}
    assert not [r for r in subscriber.records if r.get("verified") is False]

    forged = httpx.post(subscriber.url, content=b"{}", headers={
        "webhook-id": "x", "webhook-timestamp": str(int(time.time())),
        "webhook-signature": "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="})
    assert forged.status_code == 401


@pytest.mark.parametrize("language", ["python", "node"])
def test_the_example_subscribers_verify_and_parse_batch_pushes(
        bus: RunningBus, api_key: str, unique: str, language: str) -> None:
    destination, port = f"examples-batch-{language}-{unique}", free_port()
    bus.create_destination(destination, "rabbitmq")
    subscription = bus.subscribe(destination, "batched", f"http://127.0.0.1:{port}/hook",
                                 batch_max_messages=10, batch_max_wait_ms=200)
    command = ([sys.executable, str(EXAMPLES / "subscriber.py")] if language == "python"
               else ["node", str(EXAMPLES / "subscriber.cjs")])
    subscriber = ExampleSubscriber(command, port, subscription["signing_secrets"][0])
    try:
        bus.wait_for_workers([f"{destination}/batched"])
        sent = _send_every_kind(bus, api_key, destination)
        more = [_send(bus, api_key, destination, body={"n": n}) for n in range(12)]
        eventually(lambda: {*sent.values(), *more} <= set(subscriber.verified()), 30,
                   "the batches")
        got = subscriber.verified()
        assert all(got[m]["batch"] for m in [*sent.values(), *more]), "not batch pushes"
        assert len({got[m]["batch"] for m in more}) < len(more), "never more than one a push"
        assert got[sent["binary"]]["size"] == len(BINARY)
        assert got[sent["binary"]]["bizid"] == BIZ_ID
        assert got[sent["binary"]]["datacontenttype"] == "application/x-protobuf"
        assert got[sent["traced"]]["traceparent"] == PARENT
        assert not [r for r in subscriber.records if r.get("verified") is False]

        forged = httpx.post(subscriber.url, content=b"[]", headers={
            "content-type": "application/cloudevents-batch+json",
            "webhook-id": "x", "webhook-timestamp": str(int(time.time())),
            "webhook-signature": "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="})
        assert forged.status_code == 401
    finally:
        subscriber.stop()


def test_the_third_party_libraries_alone_verify_and_parse_every_text_push(
        bus: RunningBus, api_key: str, unique: str) -> None:
    destination = f"libraries-{unique}"
    bus.create_destination(destination, "rabbitmq")
    subscriber = RecordingSubscriber()
    subscription = bus.subscribe(destination, "libs", bus.serve_subscriber(subscriber))
    bus.wait_for_workers([f"{destination}/libs"])
    sent = _send_every_kind(bus, api_key, destination)
    eventually(lambda: set(sent.values()) <= subscriber.message_ids(), 30, "the pushes")
    webhook = Webhook(subscription["signing_secrets"][0])
    for push in subscriber.pushes:
        headers = dict(push.headers)
        event = from_binary_event(HTTPMessage(headers=headers, body=push.body))
        assert event.get_type() == destination
        if event.get_id() == sent["binary"]:
            assert event.get_attributes()["bizid"] == BIZ_ID  # the SDK percent-decodes it
            with pytest.raises((UnicodeDecodeError, WebhookVerificationError)):
                webhook.verify(push.body, headers)  # the library's limit: text bodies only
        else:
            assert webhook.verify(push.body, headers) == json.loads(push.body)


def test_the_third_party_libraries_alone_verify_and_parse_batch_pushes(
        bus: RunningBus, api_key: str, unique: str) -> None:
    destination = f"libraries-batch-{unique}"
    bus.create_destination(destination, "kafka")
    subscriber = BatchSubscriber()
    subscription = bus.subscribe(destination, "libs", bus.serve_subscriber(subscriber),
                                 batch_max_messages=10)
    bus.wait_for_workers([f"{destination}/libs"])
    sent = _send_every_kind(bus, api_key, destination)
    eventually(lambda: set(sent.values()) <= set(subscriber.delivered()), 30, "the batches")
    webhook = Webhook(subscription["signing_secrets"][0])
    for push in subscriber.all_pushes():
        events = webhook.verify(push.body, push.headers)  # a batch body is JSON: it verifies
        parsed = {e.get_id(): e for e in (JSONFormat().read(None, json.dumps(event))
                                          for event in events)}
        if sent["binary"] in parsed:
            assert parsed[sent["binary"]].get_data() == BINARY
            assert parsed[sent["binary"]].get_attributes()["bizid"] == BIZ_ID
        assert {e.get_type() for e in parsed.values()} == {destination}
