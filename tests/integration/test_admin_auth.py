"""Admin users, roles, API tokens, sessions with CSRF, and the audit log, on the running bus
(real MongoDB-protocol server). Named `admin` so that `pytest -k admin` selects them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from msgbus_devtools.testkit.bus import RunningBus

from admin.security import SESSION_COOKIE
from msgbus_cli.main import main as cli


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _user(bus: RunningBus, role: str, password: str = "correct horse battery") -> str:
    name = _name(role)
    bus.admin.put(f"/v1/users/{name}", json={"password": password, "role": role}
                  ).raise_for_status()
    return name


@pytest.fixture
def anonymous(bus: RunningBus) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=bus.admin_url, timeout=10) as client:
        yield client


def _login(client: httpx.Client, name: str,
           password: str = "correct horse battery") -> dict[str, str]:
    response = client.post("/v1/session", json={"username": name, "password": password})
    response.raise_for_status()
    return dict(response.json())


def _token_client(bus: RunningBus, role: str, token_role: str | None = None) -> httpx.Client:
    """A client with an API token of a new user of `role`."""
    return bus.client_of(bus.add_user(role), token_role=token_role)


def test_admin_login_session_needs_csrf_for_changes_and_logout_ends_it(
        bus: RunningBus, anonymous: httpx.Client) -> None:
    name = _user(bus, "operator")
    wrong = anonymous.post("/v1/session", json={"username": name, "password": "nope"})
    assert wrong.status_code == 401 and wrong.json()["message"] == "wrong user name or password"
    assert anonymous.get("/v1/destinations").status_code == 401

    session = _login(anonymous, name)
    assert session["role"] == "operator"
    assert anonymous.get("/v1/destinations").status_code == 200
    assert anonymous.get("/v1/session").json()["name"] == name

    code = _name("auth")
    bus.create_destination(code, "direct")
    bus.subscribe(code, "s", "http://127.0.0.1:9/hook")
    pause = f"/v1/destinations/{code}/subscriptions/s/pause"
    no_csrf = anonymous.post(pause)
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.json()["message"]
    assert anonymous.post(pause, headers={"x-csrf-token": "forged"}).status_code == 403
    assert anonymous.post(pause, headers={"x-csrf-token": session["csrf_token"]}
                          ).status_code == 200

    assert anonymous.delete("/v1/session").status_code == 204
    assert anonymous.get("/v1/destinations").status_code == 401


def test_admin_roles_decide_what_each_user_may_do(bus: RunningBus) -> None:
    code = _name("roles")
    bus.create_destination(code, "direct")
    bus.subscribe(code, "s", "http://127.0.0.1:9/hook")
    pause = f"/v1/destinations/{code}/subscriptions/s/pause"
    dry_run = {"destination": code, "since": "2026-01-01T00:00:00Z",
               "until": "2026-01-02T00:00:00Z", "dry_run": True}
    expected: list[tuple[str, str, dict[str, Any] | None, tuple[int, int, int]]] = [
        # method, path, body, status for a viewer, an operator, an admin
        ("GET", "/v1/destinations", None, (200, 200, 200)),
        # a bus-wide viewer in no team sees the catalogue only (msgbus/permissions.py)
        ("GET", f"/v1/destinations/{code}/subscriptions/s/parked", None, (403, 200, 200)),
        ("POST", pause, None, (403, 200, 200)),
        ("POST", "/v1/replays", dry_run, (403, 200, 200)),
        ("PUT", f"/v1/destinations/{code}", {"broker": "direct"}, (403, 403, 200)),
        ("POST", "/v1/apps", {"name": _name("app")}, (403, 403, 201)),
        ("GET", "/v1/users", None, (403, 403, 200)),
    ]
    clients = [_token_client(bus, role) for role in ("viewer", "operator", "admin")]
    try:
        for method, path, body, statuses in expected:
            got = tuple(c.request(method, path, json=body).status_code for c in clients)
            assert got == statuses, f"{method} {path}: {got}"
        denied = clients[0].post(pause)
        assert denied.json()["message"].endswith(
            "that needs a maintainer of platform (or the bus-wide role operator); "
            f"{clients[0].get('/v1/session').json()['name']} is not a member of team platform")
    finally:
        for client in clients:
            client.close()
    with httpx.Client(base_url=bus.admin_url, timeout=10) as nobody:
        assert nobody.get("/v1/destinations").status_code == 401
        assert nobody.get("/v1/destinations", headers={"authorization": "Bearer mbt_nope"}
                          ).status_code == 401


def test_admin_api_tokens_are_shown_once_capped_by_role_and_revocable(bus: RunningBus) -> None:
    operator = _token_client(bus, "operator")
    viewer_of_operator = _token_client(bus, "operator", token_role="viewer")
    try:
        assert viewer_of_operator.post("/v1/replays", json={}).status_code == 403
        made = operator.post("/v1/tokens", json={"name": "deploy"}).json()
        assert made["token"].startswith("mbt_") and made["role"] == "operator"
        escalate = operator.post("/v1/tokens", json={"name": "x", "role": "admin"})
        assert escalate.status_code == 403
        listed = operator.get("/v1/tokens").json()
        assert made["token_id"] in {t["token_id"] for t in listed}
        assert all(made["token"] not in str(t) for t in listed), "a token was shown again"

        with httpx.Client(base_url=bus.admin_url, timeout=10,
                          headers={"authorization": f"Bearer {made['token']}"}) as deploy:
            assert deploy.get("/v1/destinations").status_code == 200
            assert operator.delete(f"/v1/tokens/{made['token_id']}").status_code == 204
            assert deploy.get("/v1/destinations").status_code == 401
    finally:
        operator.close()
        viewer_of_operator.close()


def test_admin_audit_log_names_who_changed_what(bus: RunningBus) -> None:
    admin = _token_client(bus, "admin")
    try:
        who = admin.get("/v1/session").json()["name"]
        code = _name("audited")
        admin.put(f"/v1/destinations/{code}", json={"broker": "direct",
                                                    "description": "orders"}
                  ).raise_for_status()
        entries = admin.get("/v1/audit", params={"target": code}).json()
        assert [(e["by"], e["action"], e["details"]["description"]) for e in entries] == [
            (who, "destination.put", "orders")]
        assert entries[0]["role"] == "admin" and entries[0]["via"] == "token"
    finally:
        admin.close()


def test_admin_users_bad_input_is_a_clear_4xx(bus: RunningBus) -> None:
    short = bus.admin.put(f"/v1/users/{_name('u')}", json={"password": "short",
                                                           "role": "viewer"})
    assert short.status_code == 422 and short.json()["field"] == "password"
    no_role = bus.admin.put(f"/v1/users/{_name('u')}", json={"password": "long enough pw"})
    assert no_role.status_code == 400 and "role" in no_role.json()["message"]
    bad_name = bus.admin.put("/v1/users/Bad Name", json={"password": "long enough pw",
                                                         "role": "viewer"})
    assert bad_name.status_code == 422 and bad_name.json()["field"] == "name"


def test_admin_session_expires(bus: RunningBus) -> None:
    url = bus.start_admin(session_ttl_s=1.0)
    name = _user(bus, "viewer")
    with httpx.Client(base_url=url, timeout=10) as client:
        _login(client, name)
        assert client.get("/v1/destinations").status_code == 200
        cookie = client.cookies[SESSION_COOKIE]
    time.sleep(2.1)  # the session's lifetime passing is the scenario itself
    # a browser drops the cookie at its max-age; a replayed old cookie is refused too
    with httpx.Client(base_url=url, timeout=10, cookies={SESSION_COOKIE: cookie}) as client:
        expired = client.get("/v1/destinations")
        assert expired.status_code == 401 and "expired" in expired.json()["message"]


def test_admin_users_cli_creates_a_user_who_can_log_in(bus: RunningBus,
                                                       anonymous: httpx.Client) -> None:
    name = _name("cli")
    env = {"MSGBUS_MONGO_URI": bus.connections.mongo_uri,
           "MSGBUS_MONGO_DB": bus.connections.mongo_db}
    runner = CliRunner()
    made = runner.invoke(cli, ["users", "add", name, "--role", "operator", "--password-stdin"],
                         input="a long password\n", env=env)
    assert made.exit_code == 0, made.output
    assert _login(anonymous, name, "a long password")["role"] == "operator"
    again = runner.invoke(cli, ["users", "add", name, "--password-stdin"],
                          input="a long password\n", env=env)
    assert again.exit_code == 1 and "exists" in again.output


def test_admin_every_api_route_needs_a_login(bus: RunningBus) -> None:
    """Every management route answers 401 without credentials, except logging in."""
    paths = httpx.get(f"{bus.admin_url}/openapi.json", timeout=10).json()["paths"]
    checked = 0
    with httpx.Client(base_url=bus.admin_url, timeout=10) as nobody:
        for path, methods in paths.items():
            if not path.startswith("/v1/"):
                continue
            concrete = (path.replace("{code}", "x").replace("{name}", "y")
                        .replace("{replay_id}", "z").replace("{action}", "start")
                        .replace("{message_id}", "m").replace("{token_id}", "t"))
            for method in methods:
                if (method, path) == ("post", "/v1/session") or (
                        method, path) == ("delete", "/v1/session"):
                    continue
                response = nobody.request(method.upper(), concrete, json={})
                assert response.status_code == 401, f"{method.upper()} {path}: " \
                                                     f"{response.status_code}"
                checked += 1
    assert checked >= 25, f"only {checked} routes found"
