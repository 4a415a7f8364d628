"""Every page of the admin UI, walked in a real browser (Playwright on Debian's chromium) over a
bus with something on each page: axe-core (npm, tests/tools) finds no serious or critical
accessibility violation on any of them, and each answers within its server-timing budget's
order of magnitude here (the budget itself is measured by bench.admin_pages). Screenshots go
to tests/artifacts/admin/walk/ (the ones in docs/images/ are copies of them)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from msgbus_devtools.testkit.bus import RunningBus, StartBus
from msgbus_devtools.testkit.subscriber import ScriptedSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus.models import utcnow

AXE = Path(__file__).parents[1] / "tools" / "node_modules" / "axe-core" / "axe.min.js"
SHOTS = Path(__file__).parents[1] / "artifacts" / "admin" / "walk"
BLOCKING = {"serious", "critical"}
PASSWORD = "walk test password"


@pytest.fixture(scope="module")
def bus(start_bus: StartBus) -> Iterator[RunningBus]:
    with start_bus("ui-walk") as running:
        yield running


@pytest.fixture(scope="module")
def seeded(bus: RunningBus) -> dict[str, str]:
    """A destination on Kafka with a schema, a subscription that parks one message, one that
    gets everything, a delayed message, a replay: every page has rows to show."""
    tag = uuid.uuid4().hex[:6]
    code = f"walk-{tag}"
    bus.create_destination(code, "kafka", owner="team-walk", description="walked orders")
    bus.admin.put(f"/v1/destinations/{code}/schemas", json={"schema": {
        "type": "object", "properties": {"sku": {"type": "string"}}}}).raise_for_status()
    picky = ScriptedSubscriber(script=lambda nth: 410, answer_body=b'{"error": "gone"}')
    bus.subscribe(code, "picky", bus.serve_subscriber(picky),
                  retry_policy={"permanent_status_codes": [410]})
    fine = bus.subscribe_recorder(code, "fine")
    bus.wait_for_workers([f"{code}/picky"])
    key = bus.create_app(f"walk-{tag}", team="team-walk")  # the destination takes its team's
    message_id = uuid7()
    for body in ({"message_id": message_id, "biz_id": f"order-{tag}", "body": {"sku": "a"}},
                 {"message_id": uuid7(), "biz_id": f"later-{tag}", "body": {"sku": "b"},
                  "delay_s": 3600}):
        sent = httpx.post(f"{bus.receiver_url}/v1/destinations/{code}/messages", timeout=10,
                          headers={"authorization": f"Bearer {key}"}, json=body)
        assert sent.status_code == 202, sent.text
    eventually(lambda: message_id in fine.message_ids(), 30, "the push to fine")
    eventually(lambda: bus.admin.get(f"/v1/destinations/{code}/subscriptions/picky/parked"
                                     ).json(), 30, "the parked delivery")
    bus.admin.post("/v1/replays", json={
        "destination": code, "since": (utcnow() - timedelta(minutes=5)).isoformat(),
        "until": utcnow().isoformat(), "subscriptions": ["fine"]}).raise_for_status()
    user = f"walk-{tag}"
    bus.admin.put(f"/v1/users/{user}", json={"password": PASSWORD, "role": "admin"}
                  ).raise_for_status()
    bus.join_team("team-walk", user)  # reads the messages of the walked destination
    return {"code": code, "message_id": message_id, "user": user}


def pages(seeded: dict[str, str]) -> list[tuple[str, str]]:
    code, message_id = seeded["code"], seeded["message_id"]
    return [
        ("dashboard", "/ui/dashboard"),
        ("destinations", "/ui/destinations"),
        ("destination", f"/ui/destinations/{code}"),
        ("schemas", f"/ui/destinations/{code}/schemas"),
        ("replication", f"/ui/destinations/{code}/replication"),
        ("scheduled", f"/ui/destinations/{code}/scheduled"),
        ("subscription", f"/ui/subscriptions/{code}/picky"),
        ("subscription-week", f"/ui/subscriptions/{code}/fine?range=week"),
        ("new-subscription", f"/ui/subscriptions/{code}/new"),
        ("messages", "/ui/messages"),
        ("messages-filtered", f"/ui/messages?destination={code}&status=parked"),
        ("message", f"/ui/messages/{message_id}"),
        ("parked", f"/ui/parked/{code}/picky"),
        ("replays", "/ui/replays"),
        ("audit", "/ui/audit"),
        ("teams", "/ui/teams"),
        ("team", "/ui/teams/team-walk"),
    ]


def _serious_violations(page: Any) -> list[str]:
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => await axe.run(document)")
    return [f"{v['id']} ({v['impact']}): {v['help']} — "
            + "; ".join(node["target"][0] for node in v["nodes"][:3])
            for v in result["violations"] if v["impact"] in BLOCKING]


def test_admin_ui_every_page_has_no_serious_accessibility_violation(
        bus: RunningBus, seeded: dict[str, str], browser: object) -> None:
    assert AXE.exists(), f"{AXE} is missing: npm ci --prefix tests/tools"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page: Any = browser.new_page(  # type: ignore[attr-defined]
        base_url=bus.admin_url, viewport={"width": 1280, "height": 900})
    found: dict[str, list[str]] = {}
    try:
        page.goto("/ui/login")
        found["login"] = _serious_violations(page)
        page.fill("input[name=username]", seeded["user"])
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url("**/ui/dashboard")
        for name, path in pages(seeded):
            response = page.goto(path)
            assert response is not None and response.status == 200, (name, response)
            found[name] = _serious_violations(page)
            if name == "messages-filtered":  # a state of one of the destination's two
                # subscriptions: the parked message
                assert seeded["message_id"] in page.locator("#results").inner_text()
            page.screenshot(path=str(SHOTS / f"{name}.png"))  # what a screen shows first
        _redrive_from_the_subscription_page(bus, page, seeded["code"])
    finally:
        page.close()
    assert {name: v for name, v in found.items() if v} == {}, json.dumps(found, indent=2)


def _redrive_from_the_subscription_page(bus: RunningBus, page: Any, code: str) -> None:
    """The parked message goes back to the retries (it is parked again: the subscriber still
    answers 410), and the audit log says who did it."""
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"/ui/subscriptions/{code}/picky")
    page.get_by_role("button", name="Redrive 1 parked").click()
    eventually(lambda: any(e["action"] == "parked.redrive" for e in bus.admin.get(
        "/v1/audit", params={"target": f"{code}/picky"}).json()), 10, "the redrive audited")
