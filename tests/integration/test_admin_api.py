"""Admin API: producer apps and their keys, dead letters discarded with a reason, destination
owners — on the running bus. Named `admin` so that `pytest -k admin` selects them."""

from __future__ import annotations

import uuid

import httpx
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.subscriber import ScriptedSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7


def _send(bus: RunningBus, key: str, code: str) -> httpx.Response:
    return httpx.post(f"{bus.receiver_url}/v1/destinations/{code}/messages",
                      json={"message_id": uuid7(), "body": {"n": 1}},
                      headers={"authorization": f"Bearer {key}"}, timeout=10)


def test_admin_producer_app_keys_are_listed_without_secrets_added_and_revoked(
        bus: RunningBus) -> None:
    code = f"apps-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct", owner="team-orders")
    assert next(d for d in bus.admin.get("/v1/destinations").json()
                if d["code"] == code)["team"] == "team-orders"  # the label names the team
    name = f"app-{uuid.uuid4().hex[:6]}"
    first = bus.admin.post("/v1/apps", json={"name": name, "destinations": [code],
                                             "team": "team-orders"}).json()
    assert _send(bus, first["api_key"], code).status_code == 202

    second = bus.admin.post(f"/v1/apps/{name}/keys")
    assert second.status_code == 201
    listed = next(a for a in bus.admin.get("/v1/apps").json() if a["name"] == name)
    assert listed["keys"] == 2 and listed["destinations"] == [code]
    assert listed["team"] == "team-orders"
    assert first["api_key"] not in str(listed) and "key_hashes" not in listed

    assert bus.admin.delete(f"/v1/apps/{name}/keys").status_code == 204
    # a key no receiver has cached is refused at once (a cached one within 30 s)
    refused = _send(bus, second.json()["api_key"], code)
    assert refused.status_code == 401
    assert bus.admin.post("/v1/apps/nobody/keys").status_code == 404
    audit = bus.admin.get("/v1/audit", params={"target": name}).json()
    assert [e["action"] for e in audit] == ["app.keys_revoke", "app.key_add", "app.create"]


def test_admin_discards_parked_deliveries_with_a_reason(bus: RunningBus) -> None:
    key = bus.create_app(f"discard-{uuid.uuid4().hex[:6]}")
    code = f"discard-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    subscriber = ScriptedSubscriber(status=410)
    bus.subscribe(code, "s", bus.serve_subscriber(subscriber),
                  retry_policy={"permanent_status_codes": [410]})
    bus.wait_for_workers([f"{code}/s"])
    assert _send(bus, key, code).status_code == 202
    parked = f"/v1/destinations/{code}/subscriptions/s/parked"
    eventually(lambda: len(bus.admin.get(parked).json()) == 1, 20, "the parked delivery")

    no_reason = bus.admin.post(f"{parked}/discard", json={})
    assert no_reason.status_code == 422 and no_reason.json()["field"] == "reason"
    done = bus.admin.post(f"{parked}/discard", json={"reason": "order was cancelled"}).json()
    assert done == {"subscription": f"{code}/s", "discarded": 1,
                    "reason": "order was cancelled"}
    assert bus.admin.get(parked).json() == []
    [message_id] = subscriber.message_ids()
    delivery = bus.admin.get(f"/v1/messages/{message_id}").json()["deliveries"][0]
    assert delivery["status"] == "discarded"
    assert delivery["discard_reason"] == "order was cancelled"
