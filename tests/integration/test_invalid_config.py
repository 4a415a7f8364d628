"""One bad write never stops the bus: what the admin stores reads back, and stored documents
that do not validate (an old version's, edited by hand) are skipped, reported and fixable.

The bus of this module starts on a database that already holds a subscription, a destination,
a producer app and a user that do not validate, beside valid ones with a real subscriber."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from msgbus_devtools.testkit.bus import RunningBus, sample_value
from msgbus_devtools.testkit.loop import BackgroundLoop
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.auth import hash_api_key, new_api_key
from msgbus.ids import uuid7
from msgbus.models import Destination
from msgbus.store import MongoStore

DEST, BAD_DEST = "okdest", "baddest"
# the request of issue 26: valid as given, 2,084 characters once percent-encoded
LONG_URL = "https://" + "0" * 60 + ".com/" + "a" * 2007 + " x"
BAD_APP_KEY = new_api_key()
NOW = datetime.now(UTC)


def _seed_invalid_documents(store: MongoStore, good_url: str) -> Any:
    async def seed() -> None:
        await store.config.save_destination(Destination(code=DEST))
        await store.db.destinations.insert_one({"_id": BAD_DEST, "code": BAD_DEST,
                                                "broker": "direct", "partitions": "four"})
        for name, url in (("good", good_url), ("s5", LONG_URL.replace(" ", "%20"))):
            await store.db.subscriptions.insert_one({
                "_id": f"{DEST}/{name}", "destination": DEST, "name": name, "url": url,
                "signing_secrets": ["whsec_" + "A" * 32], "created_at": NOW,
                "updated_at": NOW})
        await store.db.apps.insert_one({"_id": "badapp", "key_hashes": [hash_api_key(BAD_APP_KEY)],
                                        "destinations": "*", "created_at": NOW})
        await store.db["users"].insert_one({"_id": "baduser", "password_hash": "scrypt$x",
                                            "role": 7, "created_at": NOW, "updated_at": NOW})

    return seed()


@pytest.fixture(scope="module")
def subscriber() -> RecordingSubscriber:
    return RecordingSubscriber()


@pytest.fixture(scope="module")
def bus(mongo_uri: str, kafka_bootstrap: str, rabbitmq_url: str, subscriber: RecordingSubscriber,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBus]:
    """A bus started on a database that holds invalid documents (its own: they would show in
    every other test's lists)."""
    loop = BackgroundLoop()
    running = RunningBus(loop, mongo_uri=mongo_uri, mongo_db=f"invalid_{uuid.uuid4().hex[:8]}",
                         state_dir=tmp_path_factory.mktemp("invalid-config"),
                         kafka_bootstrap=kafka_bootstrap, rabbitmq_url=rabbitmq_url)
    good_url = running.serve_subscriber(subscriber)
    running.query(_seed_invalid_documents(running.store, good_url))
    try:
        yield running.start()
    finally:
        running.close()
        loop.close()


@pytest.fixture(scope="module")
def api_key(bus: RunningBus) -> str:
    return bus.create_app("producer")


def _send(bus: RunningBus, key: str, code: str = DEST) -> httpx.Response:
    return httpx.post(f"{bus.receiver_url}/v1/destinations/{code}/messages",
                      json={"message_id": uuid7(), "body": {"n": 1}},
                      headers={"authorization": f"Bearer {key}"}, timeout=10)


def _invalid(bus: RunningBus) -> dict[tuple[str, str], dict[str, Any]]:
    answer = bus.admin.get("/v1/invalid-documents")
    assert answer.status_code == 200, answer.text
    return {(d["collection"], d["id"]): d for d in answer.json()["documents"]}


def test_the_request_that_bricked_the_bus_is_refused_naming_the_url(bus: RunningBus) -> None:
    answer = bus.admin.put(f"/v1/destinations/{DEST}/subscriptions/s6", json={"url": LONG_URL})
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "url"
    assert "s6" not in {s["name"] for s in bus.admin.get("/v1/subscriptions").json()}


def test_every_service_starts_and_delivers_the_valid_subscriptions(
        bus: RunningBus, api_key: str, subscriber: RecordingSubscriber) -> None:
    bus.wait_for_workers([f"{DEST}/good"])
    answer = _send(bus, api_key)
    assert answer.status_code == 202, answer.text
    message_id = answer.json()["message_id"]
    eventually(lambda: message_id in subscriber.message_ids(), 30, "the push to okdest/good")
    for url in (bus.receiver_url, bus.dispatcher_url, bus.compensator_url, bus.admin_url):
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_lists_answer_the_valid_items_and_say_how_many_were_left_out(bus: RunningBus) -> None:
    subs = bus.admin.get("/v1/subscriptions", params={"destination": DEST})
    assert subs.status_code == 200
    assert "s5" not in {s["name"] for s in subs.json()}
    assert subs.headers["x-msgbus-left-out"] == "1"
    destinations = bus.admin.get("/v1/destinations")
    assert BAD_DEST not in {d["code"] for d in destinations.json()}
    assert destinations.headers["x-msgbus-left-out"] == "1"
    assert "badapp" not in {a["name"] for a in bus.admin.get("/v1/apps").json()}
    users = bus.admin.get("/v1/users")
    assert users.status_code == 200 and users.headers["x-msgbus-left-out"] == "1"


def test_the_admin_reports_each_invalid_document_with_its_field(bus: RunningBus) -> None:
    found = _invalid(bus)
    assert found[("subscriptions", f"{DEST}/s5")]["field"] == "url"
    assert found[("destinations", BAD_DEST)]["field"] == "partitions"
    assert found[("apps", "badapp")]["field"].startswith("destinations")
    assert found[("users", "baduser")]["field"] == "role"
    metrics = httpx.get(f"{bus.receiver_url}/metrics", timeout=10).text
    assert sample_value(metrics, "msgbus_config_invalid_documents",
                        {"collection": "subscriptions"}) >= 1
    page = bus.admin.get("/ui/destinations")
    assert page.status_code == 200
    assert f"{DEST}/s5" in page.text and "invalid-documents" in page.text


def test_an_invalid_destination_keeps_its_messages_with_the_sender(
        bus: RunningBus, api_key: str) -> None:
    """The sender's client keeps a message it gets a 503 for and sends it again later."""
    answer = _send(bus, api_key, BAD_DEST)
    assert answer.status_code == 503, answer.text
    assert "misconfigured" in answer.json()["message"]
    assert "retry-after" in answer.headers


def test_an_invalid_app_and_user_cannot_authenticate_until_replaced(bus: RunningBus) -> None:
    assert _send(bus, BAD_APP_KEY).status_code == 401
    replaced = bus.admin.post("/v1/apps", json={"name": "badapp", "destinations": [DEST]})
    assert replaced.status_code == 201, replaced.text
    assert _send(bus, replaced.json()["api_key"]).status_code == 202

    login = {"username": "baduser", "password": "a-long-password"}
    assert bus.admin.post("/v1/session", json=login).status_code == 401
    needs_all = bus.admin.put("/v1/users/baduser", json={"disabled": False})
    assert needs_all.status_code == 400 and needs_all.json()["field"] == "password"
    fixed = bus.admin.put("/v1/users/baduser",
                          json={"password": login["password"], "role": "viewer"})
    assert fixed.status_code == 200, fixed.text
    assert httpx.post(f"{bus.admin_url}/v1/session", json=login, timeout=10).status_code == 200
    assert not {("apps", "badapp"), ("users", "baduser")} & set(_invalid(bus))


def test_fixing_a_subscription_keeps_its_secret_and_clears_the_report(
        bus: RunningBus, subscriber: RecordingSubscriber, api_key: str) -> None:
    form = bus.admin.get(f"/ui/subscriptions/{DEST}/s5")
    assert form.status_code == 200 and "invalid-stored" in form.text
    good_url = bus.admin.get("/v1/subscriptions", params={"destination": DEST}).json()[0]["url"]
    fixed = bus.admin.put(f"/v1/destinations/{DEST}/subscriptions/s5", json={"url": good_url})
    assert fixed.status_code == 200, fixed.text
    assert fixed.json()["signing_secrets"] == ["whsec_" + "A" * 32]
    assert ("subscriptions", f"{DEST}/s5") not in _invalid(bus)
    listed = bus.admin.get("/v1/subscriptions", params={"destination": DEST})
    assert "s5" in {s["name"] for s in listed.json()}
    assert "x-msgbus-left-out" not in listed.headers
    bus.wait_for_workers([f"{DEST}/s5"])


def test_deleting_an_invalid_document_clears_it_and_a_valid_one_is_refused(
        bus: RunningBus) -> None:
    assert bus.admin.delete(f"/v1/invalid-documents/destinations/{DEST}").status_code == 409
    deleted = bus.admin.delete(f"/v1/invalid-documents/destinations/{BAD_DEST}")
    assert deleted.status_code == 204, deleted.text
    assert ("destinations", BAD_DEST) not in _invalid(bus)
    assert "x-msgbus-left-out" not in bus.admin.get("/v1/destinations").headers
    assert bus.admin.delete(
        f"/v1/invalid-documents/destinations/{BAD_DEST}").status_code == 404
    actions = [e["action"] for e in bus.admin.get(
        "/v1/audit", params={"target": f"destinations/{BAD_DEST}"}).json()]
    assert actions == ["invalid_document.delete"]


def test_services_keep_refreshing_and_log_an_invalid_document_once(
        bus: RunningBus, caplog: pytest.LogCaptureFixture) -> None:
    """A document edited by hand while the bus runs: every registry skips it, logs it once,
    and configuration changes made after it still reach the services."""
    caplog.set_level(logging.WARNING, logger="msgbus.store.checked")
    bus.query(bus.store.db.subscriptions.insert_one({
        "_id": f"{DEST}/byhand", "destination": DEST, "name": "byhand", "url": 42}))

    def warnings() -> int:
        return sum(f"{DEST}/byhand" in r.getMessage() for r in caplog.records)

    later = bus.serve_subscriber(RecordingSubscriber())
    for name in ("later1", "later2"):
        bus.subscribe(DEST, name, later)
        bus.wait_for_workers([f"{DEST}/{name}"])
        logged = warnings()
    assert logged > 0
    assert warnings() == logged  # a registry refresh after the first did not log it again


@pytest.mark.parametrize("path", [
    "/v1/destinations/\u00e9t\u00e9", "/v1/destinations/" + "a" * 101,
    "/v1/destinations/a%00b", "/v1/destinations/okdest/subscriptions/\u00e9"])
def test_non_ascii_overlong_and_control_characters_in_a_path_are_a_422(
        bus: RunningBus, path: str) -> None:
    answer = bus.admin.put(path, json={"url": "http://127.0.0.1/x"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] in ("code", "name")
