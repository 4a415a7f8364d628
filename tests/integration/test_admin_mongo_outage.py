"""The admin while MongoDB hangs (issue 37, "operators see it"): a call or page that needs
MongoDB answers 503 with a clear message within seconds, never a hung page, whoever asks (the
bootstrap token, a user's API token it checked before, one it never saw); the dashboard and
GET /v1/services still answer, with a banner; and once MongoDB answers again, so does the
admin. Its MongoDB is reached through a TcpGate that the test freezes (the server itself never
is). Named `admin` so that `pytest -k admin` selects them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from msgbus_devtools.testkit.mongo_outage import admin_through
from msgbus_devtools.testkit.tcp_gate import TcpGate, mongo_uri_through
from msgbus_devtools.testkit.waiting import eventually

BOOTSTRAP = "outage-admin-token"
CLIENT_TIMEOUT_S = 10.0  # a hung page would hold the client this long
ANSWER_BOUND_S = 5.0  # the design answers within 3 s; generous for a loaded test machine
PASSWORD = "correct horse battery"


@pytest.fixture
def admin_url(mongo_gate: TcpGate, mongo_db_name: str, tmp_path: Path) -> Iterator[str]:
    with admin_through(mongo_uri_through(mongo_gate), mongo_db_name, BOOTSTRAP, tmp_path) as url:
        try:
            yield url
        finally:
            mongo_gate.thaw()  # before the admin stops: its stop writes to MongoDB


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S,
                        headers={"authorization": f"Bearer {token}"})


def _user_token(admin: httpx.Client) -> str:
    """A new operator's API token (its user and token live in MongoDB; the bus's on-call
    reads every service's state)."""
    name = f"operator-{uuid.uuid4().hex[:6]}"
    admin.put(f"/v1/users/{name}", json={"password": PASSWORD, "role": "operator"}
              ).raise_for_status()
    with httpx.Client(base_url=str(admin.base_url), timeout=CLIENT_TIMEOUT_S) as session:
        login = session.post("/v1/session", json={"username": name, "password": PASSWORD})
        login.raise_for_status()
        made = session.post("/v1/tokens", json={"name": "ci"},
                            headers={"x-csrf-token": login.json()["csrf_token"]})
        made.raise_for_status()
        return str(made.json()["token"])


def _timed_get(client: httpx.Client, path: str) -> tuple[httpx.Response, float]:
    began = time.monotonic()
    response = client.get(path)
    return response, time.monotonic() - began


def _assert_mongo_503(response: httpx.Response, took_s: float) -> None:
    assert response.status_code == 503, response.text[:500]
    assert took_s < ANSWER_BOUND_S, f"answered after {took_s:.1f} s"
    assert int(response.headers["retry-after"]) > 0


def test_admin_answers_within_seconds_while_mongodb_hangs(mongo_gate: TcpGate,
                                                          admin_url: str) -> None:
    with _client(admin_url, BOOTSTRAP) as admin:
        tokens = _user_token(admin), _user_token(admin)
    with (_client(admin_url, BOOTSTRAP) as admin, _client(admin_url, tokens[0]) as seen,
          _client(admin_url, tokens[1]) as never_seen):
        assert seen.get("/v1/destinations").status_code == 200
        assert seen.get("/ui/dashboard").status_code == 200
        mongo_gate.freeze()

        # the first call after the hang: the gate is still open, its handler hangs
        api, took = _timed_get(admin, "/v1/destinations")
        _assert_mongo_503(api, took)
        assert api.json()["error"] == "mongo_unavailable"
        assert api.json()["message"].startswith("MongoDB is unavailable since ")
        assert api.json()["message"].endswith("this request needs it. Retry later.")

        for client in (seen, never_seen):  # a checked token, or none: 503, never a 401
            again, took = _timed_get(client, "/v1/subscriptions")
            _assert_mongo_503(again, took)
            assert again.json()["error"] == "mongo_unavailable"

        page, took = _timed_get(seen, "/ui/destinations")
        _assert_mongo_503(page, took)
        assert page.headers["content-type"].startswith("text/html")
        assert "MongoDB is unavailable since" in page.text
        assert "this page needs it" in page.text

        dashboard, took = _timed_get(seen, "/ui/dashboard")
        assert dashboard.status_code == 200 and took < ANSWER_BOUND_S
        assert 'id="mongo-banner"' in dashboard.text
        assert "MongoDB unavailable since" in dashboard.text
        assert 'id="services"' in dashboard.text and "(this admin)" in dashboard.text

        listed, took = _timed_get(seen, "/v1/services")
        assert listed.status_code == 200 and took < ANSWER_BOUND_S
        assert listed.json()["mongo"]["available"] is False
        health, took = _timed_get(admin, "/health")
        assert health.status_code == 200 and health.json()["mongo"] is False

        mongo_gate.thaw()
        eventually(lambda: seen.get("/v1/destinations").status_code == 200, 30,
                   "the admin to serve again once MongoDB answers")
        assert "mongo-banner" not in seen.get("/ui/dashboard").text
        assert never_seen.get("/v1/subscriptions").status_code == 200


def test_admin_dashboard_renders_within_seconds_when_mongodb_hangs_under_it(
        mongo_gate: TcpGate, admin_url: str) -> None:
    """The first request after the hang is a logged-in user's dashboard: the session's user
    check, the figures and the list of services each wait a bounded time, then it renders
    what the admin last read."""
    with _client(admin_url, BOOTSTRAP) as admin:
        name = f"operator-{uuid.uuid4().hex[:6]}"
        admin.put(f"/v1/users/{name}", json={"password": PASSWORD, "role": "operator"}
                  ).raise_for_status()
    with httpx.Client(base_url=admin_url, timeout=CLIENT_TIMEOUT_S) as browser:
        browser.post("/v1/session", json={"username": name, "password": PASSWORD}
                     ).raise_for_status()
        assert browser.get("/ui/dashboard").status_code == 200
        mongo_gate.freeze()
        dashboard, took = _timed_get(browser, "/ui/dashboard")
        assert dashboard.status_code == 200 and took < ANSWER_BOUND_S
        assert 'id="mongo-banner"' in dashboard.text and 'id="services"' in dashboard.text
        page, took = _timed_get(browser, "/ui/messages")
        _assert_mongo_503(page, took)
        assert "MongoDB is unavailable since" in page.text
