"""The admin web UI in a real browser (Playwright driving Debian's chromium) on the running bus:
log in, pause and resume a subscription, find a message by biz_id, open its timeline, run a
replay to the end. Screenshots of each page go to tests/artifacts/admin/ (git-ignored).
Named `admin` so that `pytest -k admin` selects them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from msgbus_devtools.testkit.bus import RunningBus, StartBus
from msgbus_devtools.testkit.subscriber import (
    CheckingSubscriber,
    RecordingSubscriber,
    ScriptedSubscriber,
)
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus.models import utcnow
from msgbus.teams import PLATFORM_TEAM
from msgbus_cli.main import main as cli

ARTIFACTS = Path(__file__).parents[1] / "artifacts" / "admin"
PASSWORD = "ui test password"
NO_CLI_CONFIG = {"MSGBUS_ADMIN_URL": None, "MSGBUS_ADMIN_TOKEN": None,
                 "MSGBUS_CLI_CONFIG": "/nonexistent/cli.toml"}


@pytest.fixture(scope="module")
def bus(start_bus: StartBus) -> Iterator[RunningBus]:
    """A bus of this module's own (own database): the dashboard shows what these tests made,
    not every destination of the session."""
    with start_bus("ui") as running:
        yield running


@pytest.fixture(scope="module")
def api_key(bus: RunningBus) -> str:
    return bus.create_app("ui-tests")


def test_admin_ui_login_pause_find_timeline_and_replay(bus: RunningBus, api_key: str,
                                                      browser: object) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    user, code = f"ui-{tag}", f"ui-{tag}"
    bus.admin.put(f"/v1/users/{user}", json={"password": PASSWORD, "role": "admin"}
                  ).raise_for_status()
    bus.join_team("team-ui", user)  # reads the messages of the team's destination
    bus.create_destination(code, "direct", owner="team-ui", description="UI test orders",
                           publisher_apps=["ui-tests"])  # besides team-ui's own apps
    subscriber = bus.subscribe_recorder(code, "billing")
    since = utcnow() - timedelta(seconds=1)
    message_id = uuid7()
    httpx.post(f"{bus.receiver_url}/v1/destinations/{code}/messages", timeout=10,
               headers={"authorization": f"Bearer {api_key}"},
               json={"message_id": message_id, "biz_id": f"order-{tag}",
                     "body": {"order": tag, "total": 42}}).raise_for_status()
    eventually(lambda: message_id in subscriber.message_ids(), 20, "the push")
    eventually(lambda: bus.query(bus.store.traces.attempts_of(message_id)), 20,
               "the attempt's record")

    page = browser.new_page(base_url=bus.admin_url)  # type: ignore[attr-defined]
    try:
        page.goto("/ui/destinations")
        assert page.url.endswith("/ui/login"), "not logged in: sent to the log-in page"
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", "wrong password")
        page.click("button[type=submit]")
        assert page.locator("form .error").inner_text() == "wrong user name or password"
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url("**/ui/dashboard")
        volume = page.locator("#volume")
        assert volume.get_by_role("img", name=f"{code}: 1 messages in 24 h").count() == 1
        health = page.locator("#health").inner_text()
        assert f"{code}/billing" in health and "100.0%" in health  # its one push succeeded
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        page.goto("/ui/destinations")
        row = page.locator(f"#sub-{code}-billing")
        assert "active" in row.inner_text()
        page.screenshot(path=str(ARTIFACTS / "destinations.png"), full_page=True)

        row.get_by_role("button", name="Pause").click()
        page.wait_for_function(
            f"document.querySelector('#sub-{code}-billing').innerText.includes('paused')")
        assert bus.admin.get("/v1/subscriptions", params={"destination": code}
                             ).json()[0]["paused"] is True
        page.locator(f"#sub-{code}-billing").get_by_role("button", name="Resume").click()
        page.wait_for_function(
            f"document.querySelector('#sub-{code}-billing').innerText.includes('active')")
        bus.wait_for_workers([f"{code}/billing"])

        page.goto("/ui/messages")
        page.fill("input[name=biz_id]", f"order-{tag}")
        page.click("button[type=submit]")
        results = page.locator("#results")
        assert message_id in results.inner_text()
        page.screenshot(path=str(ARTIFACTS / "messages.png"), full_page=True)
        results.get_by_role("link", name=message_id).click()
        page.wait_for_url(f"**/ui/messages/{message_id}")
        timeline = page.locator("#timeline").inner_text()
        assert f"{code}/billing: attempt 1" in timeline and "HTTP 200" in timeline
        assert f"{code}/billing: delivered" in timeline
        assert '"total": 42' in page.locator("#body").inner_text()
        page.screenshot(path=str(ARTIFACTS / "message.png"), full_page=True)

        page.goto("/ui/replays")
        form = page.locator("#new-replay")
        until = utcnow() + timedelta(seconds=1)
        form.locator("input[name=destination]").fill(code)
        form.locator("input[name=since]").fill(since.strftime("%Y-%m-%dT%H:%M:%S"))
        form.locator("input[name=until]").fill(until.strftime("%Y-%m-%dT%H:%M:%S"))
        form.get_by_role("button", name="Dry run").click()
        page.wait_for_function("document.querySelector('#dry-run').innerText.length > 0")
        assert page.locator("#dry-run").inner_text() == f"1 pushes to {code}/billing"
        form.get_by_role("button", name="Create").click()
        page.wait_for_function("document.querySelector('#replays').innerText.includes('planned')")
        page.locator("#replays").get_by_role("button", name="start").first.click()
        page.wait_for_function("document.querySelector('#replays .state').innerText == 'done'",
                               timeout=30_000)
        assert len([p for p in subscriber.pushes if p.message_id == message_id]) == 2
        page.screenshot(path=str(ARTIFACTS / "replays.png"), full_page=True)

        page.goto(f"/ui/parked/{code}/billing")
        assert "no parked deliveries" in page.inner_text("main")
        page.screenshot(path=str(ARTIFACTS / "parked.png"), full_page=True)

        page.goto("/ui/audit")
        audit = page.locator("#audit").inner_text()
        assert "subscription.pause" in audit and "replay.start" in audit and user in audit
        page.screenshot(path=str(ARTIFACTS / "audit.png"), full_page=True)
    finally:
        page.close()


def _logged_in_page(bus: RunningBus, browser: object, role: str = "admin") -> object:
    user = f"ui-{uuid.uuid4().hex[:6]}"
    bus.admin.put(f"/v1/users/{user}", json={"password": PASSWORD, "role": role}
                  ).raise_for_status()
    bus.join_team(PLATFORM_TEAM, user)  # reads the messages of what the tests make
    page = browser.new_page(base_url=bus.admin_url)  # type: ignore[attr-defined]
    page.goto("/ui/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/dashboard")
    page.goto("/ui/destinations")
    return page


def test_admin_ui_creates_a_destination_and_subscription_and_sends_a_test_message(
        bus: RunningBus, browser: object) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    code = f"ui-new-{uuid.uuid4().hex[:6]}"
    subscriber = RecordingSubscriber()
    url = bus.serve_subscriber(subscriber)
    page: Any = _logged_in_page(bus, browser)
    try:
        form = page.locator("#new-destination")
        form.locator("input[name=code]").fill(code)
        form.locator("select[name=broker]").select_option("kafka")
        form.locator("input[name=team]").fill("team-ui")
        form.get_by_role("button", name="Create destination").click()
        page.wait_for_selector(f"#dest-{code}")
        page.locator(f"#dest-{code}").get_by_role("link", name="+ subscription").click()
        page.wait_for_url(f"**/ui/subscriptions/{code}/new")

        sub_form = page.locator("#subscription-form")
        sub_form.locator("input[name=name]").fill("audit")
        sub_form.locator("input[name=url]").fill(url)
        delays = sub_form.locator("input[name='retry_policy.delays_s']")
        delays.fill("5, soon")  # not a number: the API says so next to the field
        sub_form.get_by_role("button", name="Create").click()
        error = page.locator("#error-retry_policy-delays_s")
        error.wait_for()
        assert "valid number" in error.inner_text()
        assert delays.get_attribute("aria-invalid") == "true"
        assert page.locator("#notice").inner_text().startswith("422:")

        delays.fill("5, 60")
        sub_form.locator("input[name='retry_policy.permanent_status_codes']").fill("400, 410")
        sub_form.locator("input[name=max_rate_per_s]").fill("50")
        served_by = sub_form.locator("select[name=dispatchers]")
        assert served_by.input_value() == "2", "a new subscription: the default, 2"
        served_by.select_option(label="every dispatcher")
        sub_form.locator("input[name='circuit.open_after_failures']").fill("5")
        sub_form.locator("input[name='filters.0.field']").fill("header:tag")
        sub_form.locator("input[name='filters.0.values']").fill("blue, green")
        sub_form.get_by_role("button", name="Add a filter").click()  # left empty: no filter
        sub_form.get_by_role("button", name="Create").click()
        page.wait_for_url(f"**/ui/subscriptions/{code}/audit")
        saved = bus.admin.get("/v1/subscriptions", params={"destination": code}).json()
        assert [(s["name"], s["url"], s["retry_policy"]["delays_s"],
                 s["retry_policy"]["permanent_status_codes"], s["max_rate_per_s"],
                 s["circuit"]["open_after_failures"], s["filters"], s["dispatchers"])
                for s in saved] == [
            ("audit", url, [5.0, 60.0], [400, 410], 50, 5,
             [{"field": "header:tag", "values": ["blue", "green"]}], None)]
        # the saved values come back into the form
        assert delays.input_value() == "5.0, 60.0"
        assert sub_form.locator("input[name='filters.0.values']").input_value() == "blue, green"
        assert served_by.input_value() == "null"
        assert "Served by every dispatcher" in page.locator("#assigned").inner_text()
        assert "it is closed" in page.locator("#pushers").inner_text()

        page.get_by_role("button", name="Send test message").click()
        page.wait_for_function(
            "document.querySelector('#test-result').innerText.includes('status_code')")
        result = page.locator("#test-result").inner_text()
        assert '"status_code": 200' in result and '"ok": true' in result
        assert len(subscriber.pushes) == 1
        assert subscriber.pushes[0].headers["ce-type"] == code

        # the signing secret, later: an admin reveals it (audited)
        page.locator("#reveal-secret").click()
        page.wait_for_function(
            "document.querySelector('#secret-result').innerText.includes('whsec_')")
        audited = bus.admin.get("/v1/audit", params={"target": f"{code}/audit"}).json()
        assert any(e["action"] == "subscription.secret_reveal" and e["via"] == "session"
                   for e in audited)
        revealed = bus.admin.post(
            f"/v1/destinations/{code}/subscriptions/audit/secrets/reveal").json()
        assert revealed["signing_secrets"][0] in page.locator("#secret-result").inner_text()
        page.screenshot(path=str(ARTIFACTS / "subscription.png"), full_page=True)
    finally:
        page.close()


def test_admin_ui_lists_and_shows_a_message_still_pending_for_a_paused_subscription(
        bus: RunningBus, api_key: str, browser: object) -> None:
    """No delivery state exists before the first outcome: the UI finds the message through
    the subscription's pending batches and shows its delivery as pending."""
    code = f"ui-pending-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "kafka")
    bus.subscribe(code, "billing", bus.serve_subscriber(RecordingSubscriber()), paused=True)
    bus.wait_for_config()  # the receiver learns of the subscription
    message_id = uuid7()
    httpx.post(f"{bus.receiver_url}/v1/destinations/{code}/messages", timeout=10,
               headers={"authorization": f"Bearer {api_key}"},
               json={"message_id": message_id, "body": {"n": 1}}).raise_for_status()
    eventually(lambda: bus.query(bus.store.progress.pending_message_ids(f"{code}/billing", 10)), 20,
               "the receiver's record")
    page: Any = _logged_in_page(bus, browser)
    try:
        page.goto(f"/ui/messages?subscription={code}/billing&status=pending")
        assert message_id in page.locator("#results").inner_text()
        page.goto(f"/ui/messages?subscription={code}/billing&status=delivered")
        assert message_id not in page.locator("main").inner_text()
        page.goto(f"/ui/messages/{message_id}")
        assert f"{code}/billing: pending" in page.locator("#timeline").inner_text()
    finally:
        page.close()


def test_admin_ui_lists_invalid_documents_and_fixes_or_deletes_them(
        bus: RunningBus, browser: object) -> None:
    """A subscription and a destination stored by hand in a form that does not validate: the
    destinations page lists both; the subscription's form replaces it, a button deletes the
    destination, and the list is empty again."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    code, broken = f"ui-fix-{tag}", f"ui-broken-{tag}"
    bus.create_destination(code, "direct")
    bus.query(bus.store.db.subscriptions.insert_one(
        {"_id": f"{code}/hooks", "destination": code, "name": "hooks", "url": "not a url"}))
    bus.query(bus.store.db.destinations.insert_one({"_id": broken, "broker": "carrier-pigeon"}))
    url = bus.serve_subscriber(RecordingSubscriber())
    page: Any = _logged_in_page(bus, browser)
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        rows = page.locator("#invalid-documents tr.invalid-document")
        assert rows.count() == 2
        page.screenshot(path=str(ARTIFACTS / "invalid-documents.png"), full_page=True)
        sub_row = page.locator(f"tr[data-id='{code}/hooks']")
        assert "url" in sub_row.inner_text()
        sub_row.get_by_role("link", name="fix").click()
        page.wait_for_url(f"**/ui/subscriptions/{code}/hooks")
        assert "does not validate" in page.locator("#invalid-stored").inner_text()
        page.locator("#subscription-form input[name=url]").fill(url)
        page.locator("#subscription-form").get_by_role("button", name="Replace").click()
        page.wait_for_function("document.querySelector('#invalid-stored') === null")
        assert [s["url"] for s in bus.admin.get(
            "/v1/subscriptions", params={"destination": code}).json()] == [url]

        page.goto("/ui/destinations")
        page.locator(f"tr[data-id='{broken}']").get_by_role("button", name="Delete").click()
        page.wait_for_function("document.querySelector('#invalid-documents') === null")
        assert bus.admin.get("/v1/invalid-documents").json()["count"] == 0
    finally:
        page.close()


def test_admin_ui_skips_a_backlog_and_deletes_after_a_confirmation(
        bus: RunningBus, browser: object) -> None:
    code = f"ui-del-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "kafka")
    bus.subscribe(code, "old", bus.serve_subscriber(RecordingSubscriber()))
    page: Any = _logged_in_page(bus, browser)
    dialogs: list[str] = []
    answer = {"accept": False}

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept() if answer["accept"] else dialog.dismiss()

    page.on("dialog", on_dialog)
    try:
        page.goto(f"/ui/subscriptions/{code}/old")
        page.locator("#skip-form input[name=reason]").fill("replayed elsewhere")
        answer["accept"] = True
        page.locator("#skip-form").get_by_role("button", name="Skip backlog").click()
        eventually(lambda: bus.admin.get("/v1/subscriptions", params={"destination": code}
                                         ).json()[0]["skip_reason"].startswith(
                                             "replayed elsewhere"), 10, "the skip saved")

        answer["accept"] = False  # the confirmation, dismissed: nothing happens
        page.get_by_role("button", name="Delete subscription").click()
        eventually(lambda: len(dialogs) == 2, 10, "the confirmation asked")
        assert "Delete subscription" in dialogs[-1]
        assert [s["name"] for s in bus.admin.get(
            "/v1/subscriptions", params={"destination": code}).json()] == ["old"]

        answer["accept"] = True
        page.get_by_role("button", name="Delete subscription").click()
        page.wait_for_url("**/ui/destinations")
        assert bus.admin.get("/v1/subscriptions", params={"destination": code}).json() == []
        page.locator(f"#dest-{code}").get_by_role("button", name="Delete destination").click()
        page.wait_for_function(
            f"document.querySelector('#dest-{code}') === null")
        assert bus.admin.get(f"/v1/destinations/{code}/subscriptions/old/pushers"
                             ).status_code == 404
        assert code not in {d["code"] for d in bus.admin.get("/v1/destinations").json()}
    finally:
        page.close()


def test_admin_ui_shows_schema_versions_their_diff_and_tries_a_message(
        bus: RunningBus, browser: object) -> None:
    """A destination with two schema versions: its card links to the schema page, which lists
    both, shows their diff and the change the rules see, and checks a message typed in."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    code = f"ui-schema-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    first = {"type": "object", "properties": {"order_id": {"type": "string"}},
             "required": ["order_id"]}
    second = first | {"properties": first["properties"] | {"amount": {"type": "number"}}}
    for schema in (first, second):
        bus.admin.put(f"/v1/destinations/{code}/schemas",
                      json={"schema": schema}).raise_for_status()
    page: Any = _logged_in_page(bus, browser)
    try:
        link = page.locator(f"#dest-{code} a.schema-link")
        assert "version 2" in link.inner_text()
        link.click()
        page.wait_for_url(f"**/ui/destinations/{code}/schemas")
        assert page.locator("tr.schema-version").count() == 2
        diff = page.locator("#schema-diff-text").inner_text()
        assert '+    "amount": {' in diff and "--- version 1" in diff
        assert "compatible in every mode" in page.locator("#schema-changes").inner_text()
        page.screenshot(path=str(ARTIFACTS / "schemas.png"), full_page=True)

        form = page.locator("#schema-try form")
        form.locator("select[name=version]").select_option("2")
        form.locator("textarea[name=body]").fill('{"order_id": "o-1", "amount": "ten"}')
        form.get_by_role("button", name="Check").click()
        result = page.locator("#try-result")
        assert "invalid against version 2" in result.inner_text()
        assert "/amount" in result.inner_text() and "(type)" in result.inner_text()
        page.locator("#schema-try textarea[name=body]").fill('{"order_id": "o-1"}')
        page.locator("#schema-try").get_by_role("button", name="Check").click()
        assert page.locator("#try-result").inner_text() == "valid against version 2"
    finally:
        page.close()


def test_admin_ui_subscription_page_charts_its_pushes_shows_failures_and_acts(
        bus: RunningBus, api_key: str, browser: object) -> None:
    """A subscriber that fails each message's first push with a 503 and a body: the page's
    outcome chart counts the deliveries and the failures, the latest failures show the status
    and what the subscriber answered, and its buttons pause, resume and plan a replay."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    code = f"ui-health-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    subscriber = ScriptedSubscriber(script=lambda nth: 503 if nth == 1 else 200,
                                    answer_body=b'{"error": "inventory db down"}')
    bus.subscribe(code, "stock", bus.serve_subscriber(subscriber),
                  retry_policy={"delays_s": [0.2]})
    bus.wait_for_workers([f"{code}/stock"])
    since = utcnow() - timedelta(seconds=1)
    sent = [uuid7() for _ in range(5)]
    for message_id in sent:
        httpx.post(f"{bus.receiver_url}/v1/destinations/{code}/messages", timeout=10,
                   headers={"authorization": f"Bearer {api_key}"},
                   json={"message_id": message_id, "body": {"sku": "s-1"}}).raise_for_status()
    eventually(lambda: set(subscriber.successes()) == set(sent), 30, "every message delivered")
    page: Any = _logged_in_page(bus, browser)
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        def pushes_shown() -> dict[str, int]:
            page.goto(f"/ui/subscriptions/{code}/stock")
            return _chart_counts(page, "Pushes by outcome")

        eventually(lambda: pushes_shown() == {"ok": 5, "failed": 5}, 20,
                   "the pushes in the chart")
        assert "10 pushes, 50.0 % delivered" in page.locator("#health-now").inner_text()
        failures = page.locator("#failures tr").all_inner_texts()[1:]
        assert len(failures) == 5 and all("503" in row for row in failures)
        assert all("inventory db down" in row for row in failures)
        assert {row.split("\t")[1].strip() for row in failures} == set(sent)
        page.screenshot(path=str(ARTIFACTS / "subscription-health.png"), full_page=True)
        # the same through the API and the command line
        shown = CliRunner().invoke(cli, [
            "subscription", "health", code, "stock", "--range", "day", "--admin-url",
            bus.admin_url, "--token", bus.admin_token, "-o", "json"], env=NO_CLI_CONFIG)
        assert shown.exit_code == 0, shown.output
        health = json.loads(shown.output)
        assert (health["unit"], health["pushes"], health["success_rate"]) == ("hour", 10, 0.5)
        assert sum(b["failed"] for b in health["buckets"]) == 5
        assert {f["answer"] for f in health["failures"]} == {'{"error": "inventory db down"}'}

        page.get_by_role("link", name="last week").click()
        page.wait_for_url("**range=week")
        assert _chart_counts(page, "Pushes by outcome") == {"ok": 5, "failed": 5}

        page.get_by_role("button", name="Pause pushes").click()
        page.get_by_role("button", name="Resume pushes").wait_for()
        assert bus.admin.get("/v1/subscriptions", params={"destination": code}
                             ).json()[0]["paused"] is True
        page.get_by_role("button", name="Resume pushes").click()
        page.get_by_role("button", name="Pause pushes").wait_for()

        form = page.locator("#replay-form")
        form.locator("input[name=since]").fill(since.strftime("%Y-%m-%dT%H:%M:%S"))
        form.locator("input[name=until]").fill(
            (utcnow() + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S"))
        form.get_by_role("button", name="Dry run").click()
        page.wait_for_function("document.querySelector('#dry-run').innerText.length > 0")
        assert page.locator("#dry-run").inner_text() == f"5 pushes to {code}/stock"
    finally:
        page.close()


def _chart_counts(page: Any, title: str) -> dict[str, int]:
    """What a chart's bars say (their titles end "<count> <kind>"), summed per kind."""
    figure = page.locator("figure.chart", has_text=title)
    counts: dict[str, int] = {}
    for label in figure.locator("rect title").all_text_contents():
        count, kind = label.rsplit(" ", 2)[-2:]
        counts[kind] = counts.get(kind, 0) + int(count)
    return counts


def test_admin_ui_destination_page_shows_its_switches_subscriptions_and_schemas(
        bus: RunningBus, browser: object) -> None:
    """A destination created on the direct path, moved to Kafka, then to RabbitMQ: its page
    lists both switches with who made them, Kafka as still drained (by its paused
    subscription, which existed before the switch), its subscription's health and its
    schema's versions."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    code = f"ui-dest-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct", owner="team-stock")
    bus.subscribe(code, "audit", bus.serve_subscriber(RecordingSubscriber()), paused=True)
    for broker in ("kafka", "rabbitmq"):
        bus.create_destination(code, broker, owner="team-stock")
    for properties in ({"sku": {"type": "string"}},
                       {"sku": {"type": "string"}, "qty": {"type": "integer"}}):
        bus.admin.put(f"/v1/destinations/{code}/schemas", json={"schema": {
            "type": "object", "properties": properties, "required": ["sku"]}}
                      ).raise_for_status()
    page: Any = _logged_in_page(bus, browser)
    try:
        page.locator(f"#dest-{code}").get_by_role("link", name=code).click()
        page.wait_for_url(f"**/ui/destinations/{code}")
        switches = [row.split("\t") for row in page.locator("#switches tr").all_inner_texts()[1:]]
        assert [(cells[1], cells[2]) for cells in switches] == [
            ("kafka", "rabbitmq"), ("direct", "kafka"), ("(created)", "direct")]
        assert "Still drained after a switch: kafka" in page.locator("#brokers").inner_text()

        def subscriptions() -> str:
            page.reload()
            return str(page.locator("#subscriptions").inner_text())

        eventually(lambda: "audit\tpaused" in subscriptions(), 20, "its subscription listed")
        versions = page.locator("#schemas tr.schema-version").all_inner_texts()
        assert [v.split("\t")[:4] for v in versions] == [
            ["2", "backward", "qty, sku", "sku"], ["1", "backward", "sku", "sku"]]
        page.screenshot(path=str(ARTIFACTS / "destination.png"), full_page=True)
    finally:
        page.close()


def test_admin_ui_sets_push_authentication_and_keeps_masked_secrets_on_save(
        bus: RunningBus, browser: object) -> None:
    """A subscriber that requires Basic and an API-key header: set in the form, the test push
    passes; the page shows the secrets masked, and saving it again keeps them."""
    code = f"ui-auth-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    password, key = f"pw-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    subscriber = CheckingSubscriber(lambda h: h.get("x-api-key") == key and h.get(
        "authorization", "").startswith("Basic "))
    bus.subscribe(code, "guarded", bus.serve_subscriber(subscriber), paused=True)
    page: Any = _logged_in_page(bus, browser)
    try:
        page.goto(f"/ui/subscriptions/{code}/guarded")
        form = page.locator("#subscription-form")
        form.locator("[data-entry='auth.headers'] input[data-key]").first.fill("X-Api-Key")
        form.locator("[data-entry='auth.headers'] input[data-value]").first.fill(key)
        form.locator("input[name='auth.basic.username']").fill("bus")
        form.locator("input[name='auth.basic.password']").fill(password)
        with page.expect_navigation():
            form.get_by_role("button", name="Save").click()

        def test_push() -> str:
            page.locator("#test-result").evaluate("e => e.innerText = ''")
            page.get_by_role("button", name="Send test message").click()
            page.wait_for_function(
                "document.querySelector('#test-result').innerText.includes('status_code')")
            return str(page.locator("#test-result").inner_text())

        assert '"status_code": 200' in test_push()
        form = page.locator("#subscription-form")
        assert form.locator("input[name='auth.basic.password']").input_value() == "********"
        assert password not in page.content() and key not in page.content()
        form.locator("input[name=timeout_ms]").fill("4000")
        with page.expect_navigation():
            form.get_by_role("button", name="Save").click()  # the masks go back: kept
        assert '"status_code": 200' in test_push()
        [shown] = bus.admin.get("/v1/subscriptions", params={"destination": code}).json()
        assert shown["timeout_ms"] == 4000
        assert shown["auth"]["basic"] == {"username": "bus", "password": "********"}
    finally:
        page.close()
