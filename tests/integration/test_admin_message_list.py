"""The admin's message list on the running bus (real SecantusDB, real subscribers): delivery
state badges per subscription, filters, keyset pages that stay put while messages arrive, and
the subscriber's answer kept with a failed attempt. Named `admin` so that `pytest -k admin`
selects them."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.subscriber import ScriptedSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7


def _send(bus: RunningBus, key: str, code: str, biz_id: str) -> str:
    message_id = uuid7()
    response = httpx.post(f"{bus.receiver_url}/v1/destinations/{code}/messages",
                          json={"message_id": message_id, "biz_id": biz_id, "body": {"n": 1}},
                          headers={"authorization": f"Bearer {key}"}, timeout=10)
    assert response.status_code == 202, response.text
    return message_id


def _listed(bus: RunningBus, **params: Any) -> httpx.Response:
    response = bus.admin.get("/v1/messages", params=params)
    assert response.status_code == 200, response.text
    # operators' browsers and bench.admin_pages read the admin's own time from it
    assert float(response.headers["server-timing"].removeprefix("app;dur=")) >= 0
    return response


def _states(item: dict[str, Any]) -> dict[str, str]:
    return {d["subscription"]: d["status"] for d in item["deliveries"]}


def _two_subscriptions(bus: RunningBus, code: str) -> None:
    bus.create_destination(code, "direct")
    bus.subscribe(code, "ok", bus.serve_subscriber(ScriptedSubscriber(status=200)))
    bus.subscribe(code, "gone", bus.serve_subscriber(ScriptedSubscriber(status=410)),
                  retry_policy={"permanent_status_codes": [410]})
    bus.wait_for_workers([f"{code}/ok", f"{code}/gone"])
    bus.wait_for_config()  # the receiver records both subscriptions with every message


def test_admin_message_list_shows_states_filters_them_and_pages_stay_put(
        bus: RunningBus, api_key: str) -> None:
    code = f"list-{uuid.uuid4().hex[:6]}"
    _two_subscriptions(bus, code)
    sent = [_send(bus, api_key, code, f"order-{n % 2}") for n in range(7)]
    eventually(lambda: all(_states(m) == {f"{code}/ok": "delivered", f"{code}/gone": "parked"}
                           for m in _listed(bus, destination=code).json())
               and len(_listed(bus, destination=code).json()) == 7, 30, "every outcome")

    newest_first = list(reversed(sent))
    assert [m["message_id"] for m in _listed(bus, destination=code).json()] == newest_first
    parked = _listed(bus, destination=code, status="parked").json()
    assert [m["message_id"] for m in parked] == newest_first
    assert _listed(bus, subscription=f"{code}/ok", status="parked").json() == []
    assert _listed(bus, destination=code, status="failed").json() == []
    by_biz = _listed(bus, biz_id="order-1", destination=code, status="delivered").json()
    assert [m["message_id"] for m in by_biz] == [sent[5], sent[3], sent[1]]

    first = _listed(bus, destination=code, limit=3)
    second = _listed(bus, destination=code, limit=3, before=first.headers["x-next-cursor"])
    assert "x-previous-cursor" not in first.headers
    # newer messages do not move older pages
    late = [_send(bus, api_key, code, "order-late") for _ in range(2)]
    again = _listed(bus, destination=code, limit=3, before=first.headers["x-next-cursor"])
    assert [m["message_id"] for m in again.json()] == newest_first[3:6]
    assert [m["message_id"] for m in second.json()] == newest_first[3:6]
    back = _listed(bus, destination=code, limit=3, after=second.headers["x-previous-cursor"])
    assert [m["message_id"] for m in back.json()] == newest_first[:3]
    last = _listed(bus, destination=code, limit=3, before=second.headers["x-next-cursor"])
    assert [m["message_id"] for m in last.json()] == newest_first[6:]
    assert "x-next-cursor" not in last.headers

    bad = bus.admin.get("/v1/messages", params={"before": "yesterday"})
    assert bad.status_code == 400 and bad.json()["field"] == "before"

    eventually(lambda: len(_listed(bus, destination=code, status="parked").json()) == 9, 30,
               "the late messages parked too")
    html = bus.admin.get("/ui/messages", params={"destination": code, "status": "parked"}).text
    assert html.count('data-status="parked"') == 9 and 'data-status="delivered"' in html
    assert all(message_id in html for message_id in late + sent)


def test_admin_keeps_the_first_bytes_of_a_failed_push_answer_and_shows_them_escaped(
        bus: RunningBus, api_key: str) -> None:
    code = f"answer-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    answer = b"<script>alert(1)</script> database down " + b"x" * 3000
    bus.subscribe(code, "s", bus.serve_subscriber(
        ScriptedSubscriber(status=500, answer_body=answer)),
        retry_policy={"permanent_status_codes": [500]})
    bus.wait_for_workers([f"{code}/s"])
    message_id = _send(bus, api_key, code, "order-1")

    def attempts() -> list[dict[str, Any]]:
        deliveries = bus.deliveries(message_id)
        return deliveries[0]["attempts_log"] if deliveries else []

    eventually(lambda: len(attempts()) == 1, 20, "the failed attempt")
    attempt = attempts()[0]
    assert attempt["status_code"] == 500
    assert attempt["answer"] == answer[:1024].decode()  # MSGBUS_PUSH_ANSWER_KEEP_BYTES
    page = bus.admin.get(f"/ui/messages/{message_id}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; database down" in page
    assert "<script>alert(1)" not in page
