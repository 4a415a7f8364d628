"""The owning team is told (msgbus/notify.py), on the running bus: a subscriber that fails
makes the circuit open, and the team's webhook gets one signed notification of it (not one per
failure, though the dispatcher's and the compensator's breakers both open), and one when it
recovers; a subscription paused by someone outside the team is told too."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from msgbus_client.verify import verify_push
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.subscriber import RecordingSubscriber, ScriptedSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7


def _told(webhook: RecordingSubscriber, secret: str, kind: str) -> list[dict[str, Any]]:
    """The notifications of `kind` the team's webhook got, each checked for its signature."""
    found = []
    for push in list(webhook.pushes):
        if push.headers.get("ce-type") == f"msgbus.{kind}":
            verify_push(secret, push.headers, push.body)
            found.append(orjson.loads(push.body))
    return found


def _recorded(bus: RunningBus, team: str, kinds: set[str]) -> list[dict[str, Any]] | None:
    """The team's recent notifications once they include every one of `kinds`."""
    recent: list[dict[str, Any]] = bus.admin.get(f"/v1/teams/{team}/notifications").json()
    return recent if {n["kind"] for n in recent} >= kinds else None


def test_admin_notifications_a_circuit_that_opens_and_closes_is_told_once_each(
        bus: RunningBus) -> None:
    team, code = f"team-{uuid.uuid4().hex[:6]}", f"notify-{uuid.uuid4().hex[:6]}"
    webhook = RecordingSubscriber()
    made = bus.admin.put(f"/v1/teams/{team}", json={"notify_url": bus.serve_subscriber(webhook)})
    secret = made.json()["notify_secret"]
    healthy = {"now": False}
    subscriber = ScriptedSubscriber(script=lambda _: 200 if healthy["now"] else 503)
    bus.create_destination(code, "direct", team=team)
    bus.subscribe(code, "flaky", bus.serve_subscriber(subscriber), team=team,
                  circuit={"open_after_failures": 3, "alive_window_s": 0, "cooldowns_s": [0.5]},
                  retry_policy={"delays_s": [0.5]})
    bus.wait_for_workers([f"{code}/flaky"])
    key = bus.create_app(f"app-{uuid.uuid4().hex[:6]}", team=team)
    post_batches(bus.receiver_url, key, [{"message_id": uuid7(), "destination": code,
                                          "body": {"n": n}} for n in range(10)])

    eventually(lambda: _told(webhook, secret, "circuit.opened"), 60, "the circuit to be told")
    healthy["now"] = True
    eventually(lambda: _told(webhook, secret, "circuit.closed"), 60, "its recovery to be told")
    [opened] = _told(webhook, secret, "circuit.opened")  # once, whoever saw it
    assert opened["subscription"] == f"{code}/flaky" and opened["team"] == team
    assert len(_told(webhook, secret, "circuit.closed")) == 1

    bus.admin.post(f"/v1/destinations/{code}/subscriptions/flaky/pause").raise_for_status()
    eventually(lambda: _told(webhook, secret, "subscription.paused"), 30,
               "the pause by someone outside the team to be told")
    # each is recorded once the webhook answered
    recent = eventually(lambda: _recorded(bus, team, {"circuit.opened", "circuit.closed",
                                                      "subscription.paused"}), 30,
                        "what was told to be recorded")
    assert all(n["outcome"] == "told (200)" for n in recent)



def test_admin_notifications_parked_messages_and_late_delivery_are_told_once(
        bus: RunningBus) -> None:
    """Ten messages the retry policy gives up on make one `messages.parked` per subscription,
    whether the dispatcher parked them (410, permanent) or the compensator (503 twice); a
    subscription whose oldest message waits past its delivery objective makes one
    `delivery.late`."""
    team, code = f"team-{uuid.uuid4().hex[:6]}", f"notify-{uuid.uuid4().hex[:6]}"
    webhook = RecordingSubscriber()
    made = bus.admin.put(f"/v1/teams/{team}", json={"notify_url": bus.serve_subscriber(webhook)})
    secret = made.json()["notify_secret"]
    bus.create_destination(code, "direct", team=team)
    never = {"open_after_failures": 1000}  # every message is pushed, none held by a circuit
    for name, status, policy in (("gone", 410, {"permanent_status_codes": [410]}),
                                 ("failing", 503, {"delays_s": [0.2], "max_attempts": 2})):
        bus.subscribe(code, name, bus.serve_subscriber(ScriptedSubscriber(
            script=lambda _, status=status: status)), team=team, retry_policy=policy,
            circuit=never)
    bus.subscribe(code, "down", bus.serve_subscriber(ScriptedSubscriber(script=lambda _: 503)),
                  team=team, retry_policy={"delays_s": [3600]}, delivery_objective_s=2)
    bus.wait_for_workers([f"{code}/gone", f"{code}/failing", f"{code}/down"])
    key = bus.create_app(f"app-{uuid.uuid4().hex[:6]}", team=team)
    post_batches(bus.receiver_url, key, [{"message_id": uuid7(), "destination": code,
                                          "body": {"n": n}} for n in range(10)])

    def parked(name: str) -> int:
        return len(bus.admin.get(f"/v1/destinations/{code}/subscriptions/{name}/parked").json())
    eventually(lambda: parked("gone") == parked("failing") == 10, 60, "all to be parked")
    eventually(lambda: len(_told(webhook, secret, "messages.parked")) == 2, 30,
               "the parking to be told")
    eventually(lambda: _told(webhook, secret, "delivery.late"), 60, "the late delivery")
    told = {n["subscription"]: n for n in _told(webhook, secret, "messages.parked")}
    assert told[f"{code}/gone"]["details"]["status_code"] == 410
    assert told[f"{code}/failing"]["details"]["status_code"] == 503
    [late] = _told(webhook, secret, "delivery.late")
    assert late["subscription"] == f"{code}/down" and late["team"] == team
    # older than 2 s, told rounded to a tenth: 2.04 s is told as 2.0
    assert late["details"]["oldest_age_s"] >= late["details"]["late_after_s"] == 2
    recent = eventually(lambda: _recorded(bus, team, {"messages.parked", "delivery.late"}), 30,
                        "what was told to be recorded")
    assert [n["kind"] for n in recent].count("messages.parked") == 2  # not one per message
