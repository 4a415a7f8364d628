"""The `msgbus` commands over the admin API, on the running bus: configuration, the signing
secret, messages, users and tokens, in both output formats, and where the admin URL and token
come from (flag, environment, config file, state directory, in that order)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from msgbus_client.errors import WebhookVerificationError
from msgbus_client.verify import verify_push
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus_cli.main import main as cli

PASSWORD = "correct horse battery"
# no MSGBUS_ADMIN_* from the machine, no config file of the user running the tests
CLEAN_ENV = {"MSGBUS_ADMIN_URL": None, "MSGBUS_ADMIN_TOKEN": None,
             "MSGBUS_CLI_CONFIG": "/nonexistent/cli.toml"}


def _run(*args: str, env: dict[str, str | None] | None = None, input: str | None = None
         ) -> Result:
    return CliRunner().invoke(cli, list(args), env={**CLEAN_ENV, **(env or {})}, input=input)


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def _json(result: Result) -> Any:
    return json.loads(_ok(result))


@pytest.fixture
def admin(bus: RunningBus) -> list[str]:
    return ["--admin-url", bus.admin_url, "--token", bus.admin_token]


def _user_token(bus: RunningBus, role: str) -> tuple[str, str]:
    """A new user of `role` and an API token of theirs."""
    name = f"{role}-{uuid.uuid4().hex[:6]}"
    bus.admin.put(f"/v1/users/{name}", json={"password": PASSWORD, "role": role}
                  ).raise_for_status()
    with httpx.Client(base_url=bus.admin_url, timeout=10) as session:
        login = session.post("/v1/session", json={"username": name, "password": PASSWORD})
        made = session.post("/v1/tokens", json={"name": "cli"},
                            headers={"x-csrf-token": login.json()["csrf_token"]})
        made.raise_for_status()
    return name, made.json()["token"]


def _verifies_with(subscriber: RecordingSubscriber, code: str, admin: list[str]) -> set[str]:
    """Which of the subscription's secrets a test push it gets now verifies with."""
    tested = _json(_run("subscription", "test", code, "s", *admin, "-o", "json"))
    push = next(p for p in subscriber.pushes if p.message_id == tested["message_id"])
    secrets = _json(_run("subscription", "secret", "reveal", code, "s", *admin, "-o", "json"))
    passing = set()
    for secret in secrets["signing_secrets"]:
        try:
            verify_push(secret, push.headers, push.body)
        except WebhookVerificationError:
            continue
        passing.add(secret)
    return passing


def test_cli_configures_a_subscription_pauses_tests_and_manages_its_secret(
        bus: RunningBus, admin: list[str]) -> None:
    code = f"cli-cfg-{uuid.uuid4().hex[:6]}"
    made = _json(_run("destination", "put", code, "--broker", "rabbitmq", "--team", "ops",
                      *admin, "-o", "json"))
    assert made["code"] == code and made["team"] == "ops"
    assert code in _ok(_run("destination", "list", *admin))
    subscriber = RecordingSubscriber()
    url = bus.serve_subscriber(subscriber)

    created = _json(_run("subscription", "put", code, "s", "--url", url, *admin, "-o", "json"))
    first_secret = created["signing_secrets"][0]
    assert _ok(_run("subscription", "pause", code, "s", *admin)).strip() == f"{code}/s paused"
    # an update changes what it names and keeps the rest: still paused, same URL
    _ok(_run("subscription", "put", code, "s", "--max-concurrency", "3", *admin))
    [listed] = _json(_run("subscription", "list", code, *admin, "--output", "json"))
    assert (listed["paused"], listed["max_concurrency"], listed["url"]) == (True, 3, url)
    table = _ok(_run("subscription", "list", code, *admin)).splitlines()
    assert table[0].split()[:4] == ["DESTINATION", "NAME", "URL", "PAUSED"]
    assert table[1].split()[:4] == [code, "s", url, "yes"]
    _ok(_run("subscription", "resume", code, "s", *admin))

    tested = _json(_run("subscription", "test", code, "s", *admin, "-o", "json"))
    assert tested["ok"] and tested["status_code"] == 200
    assert tested["message_id"] in subscriber.message_ids()

    assert first_secret in _ok(_run("subscription", "secret", "reveal", code, "s", *admin))
    rotated = _json(_run("subscription", "secret", "rotate", code, "s", "--yes", *admin,
                         "-o", "json"))
    second_secret = rotated["signing_secrets"][0]
    assert rotated["signing_secrets"][1] == first_secret and rotated["previous_secret_until"]
    shown = _ok(_run("subscription", "secret", "reveal", code, "s", *admin))
    assert f"current:  {second_secret}" in shown and f"previous: {first_secret}" in shown
    # during the overlap a subscriber verifying with either secret takes the push
    assert _verifies_with(subscriber, code, admin) == {first_secret, second_secret}
    again = _json(_run("subscription", "secret", "rotate", code, "s", "--overlap-s", "0",
                       "--yes", *admin, "-o", "json"))
    assert again["signing_secrets"][1] == second_secret  # kept, but no longer signed with
    assert _verifies_with(subscriber, code, admin) == {again["signing_secrets"][0]}
    dropped = _json(_run("subscription", "secret", "drop-previous", code, "s", "--yes",
                         *admin, "-o", "json"))
    assert dropped["signing_secrets"] == again["signing_secrets"][:1]
    actions = [e["action"] for e in _json(_run("audit", "--target", f"{code}/s", *admin,
                                               "-o", "json"))]
    assert {"subscription.secret_reveal", "subscription.secret_rotate",
            "subscription.secret_drop", "subscription.test"} <= set(actions)

    _, operator_token = _user_token(bus, "operator")
    refused = _run("subscription", "secret", "reveal", code, "s",
                   "--admin-url", bus.admin_url, "--token", operator_token)
    assert refused.exit_code == 1 and "403" in refused.output
    missing = _run("subscription", "put", "no-such-dest", "s", "--url", url, *admin)
    assert missing.exit_code == 1
    assert "404" in missing.output and "no-such-dest" in missing.output


def test_cli_finds_a_message_and_shows_its_timeline(bus: RunningBus, admin: list[str],
                                                    api_key: str) -> None:
    code = f"cli-msg-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    bus.subscribe_recorder(code, "s")
    message_id = uuid7()
    httpx.post(f"{bus.receiver_url}/v1/destinations/{code}/messages",
               json={"message_id": message_id, "biz_id": "order-7", "body": {"n": 7}},
               headers={"authorization": f"Bearer {api_key}"}, timeout=10).raise_for_status()
    def delivered() -> bool:
        timeline = bus.admin.get(f"/v1/messages/{message_id}")  # 404 until it is recorded
        return timeline.status_code == 200 and [
            d.get("status") for d in timeline.json()["deliveries"]] == ["delivered"]

    eventually(delivered, 30, "delivered")

    [found] = _json(_run("messages", "search", "--biz-id", "order-7", "--destination", code,
                         *admin, "-o", "json"))
    assert found["message_id"] == message_id
    table = _ok(_run("messages", "search", "--destination", code, *admin))
    assert message_id in table and "order-7" in table
    timeline = _ok(_run("messages", "show", message_id, *admin))
    assert f"{code}/s: delivered" in timeline and '"n":7' in timeline.replace(" ", "")
    assert _json(_run("messages", "show", message_id, *admin, "-o", "json")
                 )["message"]["biz_id"] == "order-7"
    unknown = _run("messages", "show", uuid7(), *admin)
    assert unknown.exit_code == 1 and "404" in unknown.output


def test_cli_manages_apps_users_and_tokens(bus: RunningBus, admin: list[str]) -> None:
    app = f"app-{uuid.uuid4().hex[:6]}"
    key = _json(_run("apps", "create", app, "--destination", "orders", *admin, "-o", "json"))
    assert key["api_key"] and key["destinations"] == ["orders"]
    assert app in _ok(_run("apps", "list", *admin))

    user = f"viewer-{uuid.uuid4().hex[:6]}"
    _ok(_run("users", "set", user, "--role", "viewer", "--password-stdin", *admin,
             input=PASSWORD + "\n"))
    changed = _json(_run("users", "set", user, "--disable", *admin, "-o", "json"))
    assert changed["role"] == "viewer" and changed["disabled"] is True
    assert user in _ok(_run("users", "list", *admin))
    _ok(_run("users", "delete", user, "--yes", *admin))
    assert user not in _ok(_run("users", "list", *admin))

    name, token = _user_token(bus, "operator")
    mine = ["--admin-url", bus.admin_url, "--token", token]
    made = _json(_run("tokens", "create", "deploy", "--role", "viewer", *mine, "-o", "json"))
    assert made["role"] == "viewer"
    listed = _ok(_run("tokens", "list", *mine))
    assert "deploy" in listed and name in listed
    _ok(_run("tokens", "revoke", made["token_id"], *mine))
    gone = _run("whoami", "--admin-url", bus.admin_url, "--token", made["token"])
    assert gone.exit_code == 1 and "401" in gone.output
    assert _json(_run("runtime", "show", *admin, "-o", "json"))["clusters"]
    assert _json(_run("invalid-docs", "list", *admin, "-o", "json"))["count"] >= 0


def test_cli_status_lists_each_service_and_how_it_sees_mongodb(bus: RunningBus,
                                                               admin: list[str]) -> None:
    """The bus's services advertise their /health (a receiver's beacon beats every 5 s)."""
    urls = {bus.receiver_url, bus.dispatcher_url, bus.compensator_url}

    def polled() -> dict[str, Any]:
        answer: dict[str, Any] = _json(_run("status", *admin, "-o", "json"))
        return {row["health_url"].removesuffix("/health"): row for row in answer["services"]
                if row["health_url"] and row["reachable"]}

    eventually(lambda: urls <= set(polled()), 20, "the bus's services in msgbus status")
    rows = polled()
    assert {rows[url]["component"] for url in urls} == {"receiver", "dispatcher", "compensator"}
    assert all(rows[url]["mongo"]["available"] for url in urls)
    assert rows[bus.receiver_url]["flusher"]["mode"] == "inline"
    table = _ok(_run("status", *admin))
    assert table.splitlines()[0].split() == ["COMPONENT", "INSTANCE", "REACHABLE", "MONGO",
                                             "FLUSH_PROCESS"]
    assert "available" in table and "(this admin)" not in table

def test_cli_takes_the_admin_url_and_token_from_flag_env_config_then_state_dir(
        bus: RunningBus, tmp_path: Path) -> None:
    user, user_token = _user_token(bus, "viewer")
    state = tmp_path / "state"
    state.mkdir()
    (state / "admin-url").write_text(bus.admin_url + "\n")
    (state / "admin-token").write_text(bus.admin_token + "\n")
    config = tmp_path / "cli.toml"
    whoami = ["whoami", "--state-dir", str(state), "-o", "json"]

    def who(env: dict[str, str | None], *flags: str) -> str:
        return str(_json(_run(*whoami, *flags, env=env))["name"])

    bootstrap = who({})  # the state directory's files
    assert bootstrap != user
    config.write_text(f'admin_url = "{bus.admin_url}"\ntoken = "{user_token}"\n')
    assert who({"MSGBUS_CLI_CONFIG": str(config)}) == user
    with_env = {"MSGBUS_CLI_CONFIG": str(config), "MSGBUS_ADMIN_TOKEN": bus.admin_token}
    assert who(with_env) == bootstrap
    assert who(with_env, "--token", user_token) == user
    # each value on its own: the URL from the flag beats a wrong one in the environment
    wrong_url = {"MSGBUS_ADMIN_URL": "http://127.0.0.1:9"}
    assert who(wrong_url, "--admin-url", bus.admin_url) == bootstrap
    unreachable = _run(*whoami, env=wrong_url)
    assert unreachable.exit_code == 1 and "unreachable" in unreachable.output

    nothing = _run("whoami", "--state-dir", str(tmp_path / "none"))
    assert nothing.exit_code == 2
    assert "--admin-url" in nothing.output and "MSGBUS_ADMIN_URL" in nothing.output


def test_cli_teams_members_and_a_subscription_request_decided_by_the_owning_team(
        bus: RunningBus, admin: list[str]) -> None:
    owners, askers = f"own-{uuid.uuid4().hex[:6]}", f"ask-{uuid.uuid4().hex[:6]}"
    owner_name, owner_token = _user_token(bus, "viewer")
    asker_name, asker_token = _user_token(bus, "viewer")
    for team, user in ((owners, owner_name), (askers, asker_name)):
        _ok(_run("teams", "put", team, "--description", "tests", *admin))
        _ok(_run("teams", "add-member", team, user, "--role", "maintainer", *admin))
    assert f"{owner_name} (maintainer)" in _ok(_run("teams", "list", *admin))
    as_owner = ["--admin-url", bus.admin_url, "--token", owner_token]
    as_asker = ["--admin-url", bus.admin_url, "--token", asker_token]
    code = f"cli-req-{uuid.uuid4().hex[:6]}"
    _ok(_run("destination", "put", code, "--subscribers", "approval", *as_owner))
    refused = _run("subscription", "put", code, "mine", "--url", "http://127.0.0.1:9/h",
                   *as_asker)
    assert refused.exit_code != 0 and "subscription-requests" in refused.output
    asked = _json(_run("requests", "ask", code, "mine", "--url", "http://127.0.0.1:9/h",
                       "--note", "we need it", *as_asker, "-o", "json"))
    assert asked["request_id"] in _ok(_run("requests", "list", "--state", "pending", *as_owner))
    accepted = _ok(_run("requests", "accept", asked["request_id"], *as_owner))
    assert f"accepted: {code}/mine of team {askers}" in accepted
