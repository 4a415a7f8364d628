"""Company sign-in through a real OpenID provider (npm oidc-provider, tests/tools/oidc-server.mjs)
with Playwright on Chromium: people in zero, one and two groups sign in (authorization code with
PKCE), get the teams their groups map to, and lose a team's rights at the next refresh after the
provider takes them out of its group."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from msgbus_devtools.servers import free_port, stop, wait_for_port
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.waiting import eventually

from msgbus.settings import OidcSettings

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "tools" / "oidc-server.mjs"
REFRESH_S = 1.0


@dataclass
class Provider:
    url: str
    accounts: Path

    def set_groups(self, **groups: list[str]) -> None:
        self.accounts.write_text(json.dumps({name: {"groups": g} for name, g in groups.items()}))


@dataclass
class CompanyAdmin:
    url: str
    provider: Provider
    payments: str
    orders: str


@pytest.fixture
def company_admin(bus: RunningBus, tmp_path: Path) -> Iterator[CompanyAdmin]:
    admin_port, provider_port = free_port(), free_port()
    admin_url = f"http://127.0.0.1:{admin_port}"
    provider = Provider(f"http://127.0.0.1:{provider_port}", tmp_path / "accounts.json")
    provider.set_groups(ana=["payments-devs"], bo=["payments-devs", "orders-devs"], cy=[])
    config = tmp_path / "oidc.json"
    config.write_text(json.dumps({"accounts_file": str(provider.accounts), "clients": [{
        "client_id": "msgbus-admin", "client_secret": "a-secret-of-the-tests",
        "redirect_uris": [f"{admin_url}/ui/oidc/callback"]}]}))
    with open(tmp_path / "oidc.log", "wb") as log:
        server = subprocess.Popen(["node", str(SERVER), str(provider_port), str(config)],
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", provider_port, 30)
        tag = uuid.uuid4().hex[:6]
        payments, orders = f"payments-{tag}", f"orders-{tag}"
        bus.start_admin(port=admin_port, oidc=OidcSettings(
            issuer=provider.url, client_id="msgbus-admin",
            client_secret="a-secret-of-the-tests", base_url=admin_url, prompt="consent",
            team_map={"payments-devs": f"{payments}:maintainer",
                      "orders-devs": f"{orders}:viewer"},
            refresh_s=REFRESH_S))
        yield CompanyAdmin(admin_url, provider, payments, orders)
    finally:
        stop(server.pid)


def _sign_in(browser: Any, admin: CompanyAdmin, login: str) -> Any:
    """A browser page signed in as `login` through the provider's own pages."""
    page = browser.new_context(base_url=admin.url).new_page()
    page.goto("/ui/login")
    page.click("#company-sign-in")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "anything: the development pages take any")
    page.click("button[type=submit]")
    page.click("button[type=submit]")  # consent to the scopes (offline_access: a refresh token)
    page.wait_for_url("**/ui/dashboard")
    return page


def _teams(page: Any) -> dict[str, str]:
    answer = page.request.get("/v1/session")
    assert answer.status == 200, answer.text()
    return dict(answer.json()["teams"])


def test_people_sign_in_through_the_company_provider_with_the_teams_of_their_groups(
        company_admin: CompanyAdmin, browser: Any) -> None:
    admin = company_admin
    pages = {login: _sign_in(browser, admin, login) for login in ("ana", "bo", "cy")}
    assert _teams(pages["ana"]) == {admin.payments: "maintainer"}
    assert _teams(pages["bo"]) == {admin.payments: "maintainer", admin.orders: "viewer"}
    assert _teams(pages["cy"]) == {}
    assert pages["cy"].request.get("/v1/session").json()["role"] == "viewer"

    # the provider takes bo out of orders-devs: the next refresh takes bo out of the team
    admin.provider.set_groups(ana=["payments-devs"], bo=["payments-devs"], cy=[])
    eventually(lambda: _teams(pages["bo"]) == {admin.payments: "maintainer"}, 30,
               "bo's teams to follow the provider's groups")
    assert _teams(pages["ana"]) == {admin.payments: "maintainer"}
    for page in pages.values():
        page.context.close()


def test_a_sign_in_that_did_not_start_here_is_refused(company_admin: CompanyAdmin,
                                                     browser: Any) -> None:
    page = browser.new_context(base_url=company_admin.url).new_page()
    page.goto("/ui/oidc/callback?code=forged&state=forged")
    assert "did not start here" in page.inner_text("main")
    page.context.close()
