"""Teams own destinations, subscriptions and producer apps; a member acts on their team's things
by their role in it and on no other team's, on the running bus (real MongoDB-protocol server).
The tests are named `admin_teams` so that `pytest -k admin` selects them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from msgbus_devtools.testkit.bus import USER_PASSWORD, RunningBus
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7

pytestmark = pytest.mark.integration


@dataclass
class Company:
    """Two teams, A and B, each with a destination and a subscription of its own; in A a
    maintainer and a viewer, in B a maintainer; C owns a destination nobody here is in."""

    a: str
    b: str
    a_destination: str
    b_destination: str
    a_maintainer: httpx.Client
    a_viewer: httpx.Client
    b_maintainer: httpx.Client
    a_maintainer_name: str


def _team(bus: RunningBus, members: dict[str, str]) -> str:
    name = f"team-{uuid.uuid4().hex[:6]}"
    bus.admin.put(f"/v1/teams/{name}", json={
        "description": "tests", "members": [{"user": u, "role": r} for u, r in members.items()]
    }).raise_for_status()
    return name


@pytest.fixture
def company(bus: RunningBus) -> Iterator[Company]:
    names = {role: bus.add_user("viewer") for role in ("a-maint", "a-view", "b-maint")}
    a = _team(bus, {names["a-maint"]: "maintainer", names["a-view"]: "viewer"})
    b = _team(bus, {names["b-maint"]: "maintainer"})
    a_destination, b_destination = f"{a}-orders", f"{b}-payments"
    bus.create_destination(a_destination, "direct", team=a)
    bus.create_destination(b_destination, "direct", team=b)
    bus.subscribe(a_destination, "audit", "http://127.0.0.1:9/hook", team=a)
    bus.subscribe(b_destination, "ledger", "http://127.0.0.1:9/hook", team=b)
    clients = {role: bus.client_of(name) for role, name in names.items()}
    yield Company(a, b, a_destination, b_destination, clients["a-maint"], clients["a-view"],
                  clients["b-maint"], names["a-maint"])
    for client in clients.values():
        client.close()


def _subscription(code: str, name: str) -> str:
    return f"/v1/destinations/{code}/subscriptions/{name}"


def test_admin_teams_a_maintainer_subscribes_to_another_teams_destination_and_runs_it(
        company: Company) -> None:
    c = company
    made = c.a_maintainer.put(_subscription(c.b_destination, "a-reads-payments"),
                              json={"url": "http://127.0.0.1:9/hook"})
    assert made.status_code == 200, made.text
    assert made.json()["team"] == c.a  # the caller's only team owns it
    assert c.a_maintainer.post(_subscription(c.b_destination, "a-reads-payments") + "/pause"
                               ).status_code == 200
    listed = {(s["destination"], s["name"]) for s in c.a_maintainer.get("/v1/subscriptions").json()}
    assert (c.b_destination, "a-reads-payments") in listed
    assert (c.b_destination, "ledger") not in listed  # B's own: not A's to read
    catalogue = {d["code"]: d["team"] for d in c.a_viewer.get("/v1/destinations").json()}
    assert catalogue[c.b_destination] == c.b  # everyone sees the catalogue

    # the audit names the person, their teams and the team that owns what changed
    audit = c.a_viewer.get("/v1/audit", params={"team": c.a}).json()
    paused = next(e for e in audit if e["action"] == "subscription.pause")
    assert paused["by"] == c.a_maintainer_name and paused["teams"] == [c.a]
    assert paused["owner_team"] == c.a and paused["target"] == f"{c.b_destination}/a-reads-payments"
    assert c.b_maintainer.get("/v1/audit", params={"team": c.a}).status_code == 403
    assert c.a_viewer.get("/v1/audit").status_code == 403  # every team's: the bus's on-call


def test_admin_teams_no_member_acts_beyond_their_role_or_team(company: Company) -> None:
    c = company
    refused = c.a_maintainer.post(_subscription(c.b_destination, "ledger") + "/pause")
    assert refused.status_code == 403
    assert refused.json()["message"] == (
        f"{c.a_maintainer_name} may not operate what team {c.b} owns: that needs a maintainer "
        f"of {c.b} (or the bus-wide role operator); {c.a_maintainer_name} is not a member of "
        f"team {c.b}")
    own = _subscription(c.a_destination, "audit")
    assert c.a_viewer.get(own + "/parked").status_code == 200  # a viewer reads...
    assert c.a_viewer.post(own + "/pause").status_code == 403  # ...and does not operate
    assert c.a_maintainer.delete(_subscription(c.b_destination, "ledger")).status_code == 403
    # moving A's destination to B needs the right to change what B owns too
    moved = c.a_maintainer.put(f"/v1/destinations/{c.a_destination}",
                               json={"broker": "direct", "team": c.b})
    assert moved.status_code == 403
    assert c.a_maintainer.put(f"/v1/destinations/{c.a_destination}",
                              json={"broker": "direct", "description": "A's"}).status_code == 200
    # a maintainer does not manage members; only the team's owners (and admins) do
    assert c.a_maintainer.put(f"/v1/teams/{c.a}/members/someone", json={"role": "viewer"}
                              ).status_code == 403
    assert c.b_maintainer.get("/v1/users").status_code == 403  # administers nothing bus-wide


def test_admin_teams_a_member_removed_from_the_team_loses_its_rights_at_once(
        bus: RunningBus, company: Company) -> None:
    c = company
    own = _subscription(c.a_destination, "audit")
    assert c.a_maintainer.post(own + "/pause").status_code == 200
    bus.admin.delete(f"/v1/teams/{c.a}/members/{c.a_maintainer_name}").raise_for_status()
    assert c.a_maintainer.post(own + "/resume").status_code == 403  # the next request
    assert c.a not in c.a_maintainer.get("/v1/session").json()["teams"]


def test_admin_teams_a_team_that_owns_something_is_not_deleted(
        bus: RunningBus, company: Company) -> None:
    refused = bus.admin.delete(f"/v1/teams/{company.a}")
    assert refused.status_code == 409
    assert f"destination {company.a_destination}" in refused.json()["message"]


def test_admin_teams_an_owner_label_of_the_previous_version_names_the_team(
        bus: RunningBus) -> None:
    code = f"label-{uuid.uuid4().hex[:6]}"

    async def store_as_0_1() -> None:  # a destination document as version 0.1 wrote it
        await bus.store.db.destinations.insert_one({
            "_id": code, "broker": "direct", "description": "", "owner": "Team Orders",
            "partitions": 4, "record_rate_per_s": 0.0, "retired": [],
            "created_at": datetime.now(UTC)})
    bus.loop.run(store_as_0_1())
    listed = {d["code"]: d for d in bus.admin.get("/v1/destinations").json()}
    assert listed[code]["team"] == "team-orders" and "owner" not in listed[code]


def _send(bus: RunningBus, code: str, team: str) -> str:
    key = bus.create_app(f"app-{uuid.uuid4().hex[:6]}", [code], team=team)
    message_id = uuid7()
    post_batches(bus.receiver_url, key, [{"message_id": message_id, "destination": code,
                                          "body": {"secret": "A's"}}])
    eventually(lambda: bus.admin.get(f"/v1/messages/{message_id}").status_code == 200, 30,
               "the message to be recorded")
    return message_id


def test_admin_teams_messages_are_read_by_the_destination_and_subscriber_teams_only(
        bus: RunningBus, company: Company) -> None:
    c = company
    message_id = _send(bus, c.a_destination, c.a)
    detail = f"/v1/messages/{message_id}"
    assert c.a_viewer.get(detail).json()["message"]["body"] == '{"secret":"A\'s"}'
    refused = c.b_maintainer.get(detail)
    assert refused.status_code == 403 and f"a member of {c.a}" in refused.json()["message"]
    assert c.b_maintainer.get("/v1/messages", params={"destination": c.a_destination}
                              ).status_code == 403
    assert message_id not in {m["message_id"] for m in c.b_maintainer.get("/v1/messages").json()}

    # B subscribes to A's destination: B reads its messages from then on
    assert c.b_maintainer.put(_subscription(c.a_destination, "b-copy"),
                              json={"url": "http://127.0.0.1:9/hook"}).status_code == 200
    assert c.b_maintainer.get(detail).status_code == 200

    # an admin too needs to break the glass, and both the refusal and the read are audited
    admin_name = bus.add_user("admin")
    with bus.client_of(admin_name) as admin:
        assert admin.get(detail).status_code == 403
        assert admin.post("/v1/break-glass", json={"reason": "incident 42: lost orders",
                                                   "minutes": 5}).status_code == 201
        assert admin.get(detail).status_code == 200
    actions = [(a["by"], a["action"], a["target"]) for a in bus.admin.get(
        "/v1/audit", params={"limit": 50}).json()]
    assert (admin_name, "messages.read_refused", c.a_destination) in actions
    assert (admin_name, "break_glass.start", admin_name) in actions
    assert (admin_name, "messages.read_through_broken_glass", c.a_destination) in actions


def test_admin_teams_a_destination_takes_messages_from_its_teams_apps_and_listed_ones(
        bus: RunningBus, company: Company) -> None:
    c = company
    url = f"{bus.receiver_url}/v1/destinations/{c.b_destination}/messages"
    a_app = f"a-app-{uuid.uuid4().hex[:6]}"
    a_key = bus.create_app(a_app, team=c.a)
    b_key = bus.create_app(f"b-app-{uuid.uuid4().hex[:6]}", team=c.b)

    def send(key: str) -> httpx.Response:
        return httpx.post(url, json={"message_id": uuid7(), "body": {}}, timeout=30,
                          headers={"authorization": f"Bearer {key}"})

    refused = send(a_key)
    assert refused.status_code == 403 and "it takes the apps of team" in refused.json()["message"]
    assert send(b_key).status_code == 202
    assert c.b_maintainer.put(f"/v1/destinations/{c.b_destination}", json={
        "broker": "direct", "publisher_apps": [a_app]}).status_code == 200
    eventually(lambda: send(a_key).status_code == 202, 30,
               "the receivers to see that B lists A's app")


def test_admin_teams_a_destination_on_approval_takes_other_teams_subscriptions_only_if_asked(
        company: Company) -> None:
    c = company
    assert c.b_maintainer.put(f"/v1/destinations/{c.b_destination}", json={
        "broker": "direct", "subscribers": "approval"}).status_code == 200
    refused = c.a_maintainer.put(_subscription(c.b_destination, "a-wants"),
                                 json={"url": "http://127.0.0.1:9/hook"})
    assert refused.status_code == 403
    assert "subscription-requests" in refused.json()["message"]
    own = c.b_maintainer.put(_subscription(c.b_destination, "b-own"),
                             json={"url": "http://127.0.0.1:9/hook"})
    assert own.status_code == 200  # the destination's own team needs nobody's approval

    asked = c.a_maintainer.post(f"/v1/destinations/{c.b_destination}/subscription-requests",
                                json={"name": "a-wants", "note": "for our ledger",
                                      "settings": {"url": "http://127.0.0.1:9/hook"}})
    assert asked.status_code == 201, asked.text
    request_id = asked.json()["request_id"]
    seen = {r["request_id"]: r for r in c.b_maintainer.get("/v1/subscription-requests").json()}
    assert seen[request_id]["team"] == c.a and seen[request_id]["state"] == "pending"
    decide = f"/v1/subscription-requests/{request_id}"
    assert c.a_maintainer.post(f"{decide}/accept").status_code == 403  # not A's to decide
    accepted = c.b_maintainer.post(f"{decide}/accept", json={"reason": "fine"})
    assert accepted.status_code == 200 and accepted.json()["subscription"]["team"] == c.a
    assert c.a_maintainer.post(_subscription(c.b_destination, "a-wants") + "/pause"
                               ).status_code == 200  # A's subscription now
    assert c.b_maintainer.post(f"{decide}/decline").status_code == 409  # decided once


def test_admin_teams_a_team_token_acts_for_the_team_expires_and_is_revoked(
        bus: RunningBus, company: Company) -> None:
    c = company
    made = bus.admin.post(f"/v1/teams/{c.a}/tokens", json={"name": "deploys", "role": "maintainer",
                                                           "expires_in_days": 30})
    assert made.status_code == 201, made.text
    own, other = (_subscription(c.a_destination, "audit"),
                  _subscription(c.b_destination, "ledger"))
    with httpx.Client(base_url=bus.admin_url, timeout=10, headers={
            "authorization": f"Bearer {made.json()['token']}"}) as automation:
        assert automation.post(own + "/pause").status_code == 200
        assert automation.post(other + "/pause").status_code == 403
        listed = bus.admin.get(f"/v1/teams/{c.a}/tokens").json()
        assert [t["name"] for t in listed] == ["deploys"] and listed[0]["expires_at"]
        assert bus.admin.delete(f"/v1/teams/{c.a}/tokens/{made.json()['token_id']}"
                                ).status_code == 204
        assert automation.post(own + "/resume").status_code == 401


def test_admin_teams_an_expired_token_stops_working(bus: RunningBus, company: Company) -> None:
    token_id = next(t["token_id"] for t in company.a_viewer.get("/v1/tokens").json())
    assert company.a_viewer.get("/v1/session").status_code == 200

    async def expire() -> None:  # as if its 90 days had passed
        await bus.store.db.api_tokens.update_one({"token_id": token_id}, {"$set": {
            "expires_at": datetime.now(UTC)}})
    bus.loop.run(expire())
    assert company.a_viewer.get("/v1/session").status_code == 401


def test_admin_teams_a_teams_home_shows_what_it_owns_and_decides_a_request(
        bus: RunningBus, company: Company, browser: Any) -> None:
    c = company
    c.b_maintainer.put(f"/v1/destinations/{c.b_destination}", json={
        "broker": "direct", "subscribers": "approval"}).raise_for_status()
    c.a_maintainer.post(f"/v1/destinations/{c.b_destination}/subscription-requests", json={
        "name": "a-asks", "settings": {"url": "http://127.0.0.1:9/hook"}}).raise_for_status()
    b_name = next(m["user"] for m in bus.admin.get(f"/v1/teams/{c.b}").json()["members"])
    page = browser.new_context(base_url=bus.admin_url).new_page()
    page.goto("/ui/login")
    page.fill("input[name=username]", b_name)
    page.fill("input[name=password]", USER_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/dashboard")
    page.goto(f"/ui/teams/{c.b}")
    assert c.b_destination in page.inner_text("#team-destinations")
    assert "ledger" in page.inner_text("#team-subscriptions")
    assert f"{b_name}\tmaintainer" in page.inner_text("#team-members")
    page.goto("/ui/destinations")  # the buttons follow the rules: B's subscription, not A's
    assert page.locator(f"#sub-{c.b_destination}-ledger").get_by_role("button",
                                                                      name="Pause").count() == 1
    assert page.locator(f"#sub-{c.a_destination}-audit").get_by_role("button",
                                                                     name="Pause").count() == 0
    page.goto(f"/ui/teams/{c.b}")
    page.locator("#team-requests").get_by_role("button", name="Accept").click()
    eventually(lambda: c.a_maintainer.get(_subscription(c.b_destination, "a-asks") + "/health"
                                          ).status_code == 200, 30, "the accepted subscription")
    page.context.close()


def test_admin_teams_a_member_subscribes_from_the_catalogue_or_asks_on_approval(
        bus: RunningBus, company: Company, browser: Any) -> None:
    """The catalogue's subscribe form (admin/subscribe_offer.py): A's maintainer subscribes to
    B's open destination, owned by A; to B's destination on approval the form asks instead."""
    c = company
    on_approval = f"{c.b}-approved"
    bus.create_destination(on_approval, "direct", team=c.b, subscribers="approval")
    page = browser.new_context(base_url=bus.admin_url).new_page()
    page.goto("/ui/login")
    page.fill("input[name=username]", c.a_maintainer_name)
    page.fill("input[name=password]", USER_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/dashboard")

    page.goto("/ui/destinations")
    offer = page.locator(f"#subscribe-{c.b_destination}")
    assert "Who may subscribe: any team may subscribe." in offer.inner_text()
    assert offer.locator("select[name=team]").input_value() == c.a  # the user's only team
    offer.locator("input[name=name]").fill("a-from-catalogue")
    offer.locator("input[name=url]").fill("http://127.0.0.1:9/hook")
    offer.get_by_role("button", name="Subscribe", exact=True).click()
    page.wait_for_url(f"**/ui/subscriptions/{c.b_destination}/a-from-catalogue")
    made = {(s["destination"], s["name"]): s["team"]
            for s in c.a_maintainer.get("/v1/subscriptions").json()}
    assert made[(c.b_destination, "a-from-catalogue")] == c.a

    page.goto("/ui/destinations")
    asks = page.locator(f"#subscribe-{on_approval}")
    assert f"team {c.b} decides" in asks.inner_text()
    # not without B's approval
    assert asks.get_by_role("button", name="Subscribe", exact=True).count() == 0
    asks.locator("input[name=name]").fill("a-asks-in-ui")
    asks.locator("input[name='settings.url']").fill("http://127.0.0.1:9/hook")
    asks.get_by_role("button", name="Ask to subscribe").click()
    page.wait_for_url(f"**/ui/teams/{c.a}")  # the team's home lists what it asked
    assert "a-asks-in-ui" in page.inner_text("#team-requests")
    asked = [r for r in c.b_maintainer.get("/v1/subscription-requests").json()
             if (r["destination"], r["name"]) == (on_approval, "a-asks-in-ui")]
    assert [(r["team"], r["state"]) for r in asked] == [(c.a, "pending")]
    listed = {(s["destination"], s["name"]) for s in c.a_maintainer.get("/v1/subscriptions").json()}
    assert (on_approval, "a-asks-in-ui") not in listed  # until team B accepts

    page.goto(f"/ui/destinations/{on_approval}")  # the destination's own page offers the same
    assert page.locator("#subscribe").get_by_role("button", name="Ask to subscribe").count() == 1
    page.context.close()


def test_admin_teams_alerts_can_name_the_team_a_subscription_belongs_to(
        bus: RunningBus, company: Company) -> None:
    """deploy/monitoring/alerts.yml joins msgbus_subscription_info for a `team` label."""
    line = (f'msgbus_subscription_info{{destination="{company.a_destination}",'
            f'subscription="{company.a_destination}/audit",team="{company.a}"}} 1.0')
    eventually(lambda: line in httpx.get(f"{bus.dispatcher_url}/metrics", timeout=10).text, 30,
               "the dispatcher to show the subscription's team")
