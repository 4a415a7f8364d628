"""OAuth2 client credentials in the push clients (msgbus/delivery/authenticator.py), against a
real token endpoint on 127.0.0.1 (aiohttp): one fetch shared by concurrent pushes, renewed
before it expires, fetched again once after a 401, and a clear error when the endpoint fails."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.delivery.authenticator import PushAuthenticator, PushAuthError
from msgbus.egress import EgressPolicy
from msgbus.metrics import PUSH_TOKEN_FETCHES
from msgbus.push_credentials import PushAuth


@dataclass
class TokenEndpoint:
    url: str = ""
    expires_in: float = 3600
    status: int = 200
    forms: list[dict[str, str]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)

    async def token(self, request: web.Request) -> web.Response:
        self.forms.append(dict(await request.post()))
        self.authorizations.append(request.headers.get("authorization", ""))
        await asyncio.sleep(0.05)  # concurrent pushes arrive while it is being fetched
        if self.status != 200:
            return web.json_response({"error": "invalid_client"}, status=self.status)
        return web.json_response({"access_token": f"t{len(self.forms)}",
                                  "token_type": "Bearer", "expires_in": self.expires_in})


@pytest.fixture
async def endpoint() -> AsyncIterator[TokenEndpoint]:
    found = TokenEndpoint()
    app = web.Application()
    app.router.add_post("/token", found.token)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    found.url = f"http://127.0.0.1:{port}/token"
    yield found
    await runner.cleanup()


def _auth(endpoint: TokenEndpoint, **oauth2: str) -> PushAuth:
    return PushAuth.model_validate({"oauth2": {"token_url": endpoint.url, "client_id": "bus:id",
                                               "client_secret": "s&cret", **oauth2}})


def _authenticator() -> PushAuthenticator:
    return PushAuthenticator(str, EgressPolicy((ipaddress.ip_network("127.0.0.1/32"),)), "t/1")


async def test_concurrent_pushes_share_one_token_and_a_401_fetches_one_more(
        endpoint: TokenEndpoint) -> None:
    authenticator = _authenticator()
    auth = _auth(endpoint, scope="push")
    sent = await asyncio.gather(*(authenticator.headers(auth) for _ in range(50)))
    assert {h["authorization"] for h in sent} == {"Bearer t1"} and len(endpoint.forms) == 1
    basic = base64.b64encode(b"bus%3Aid:s%26cret").decode()  # form-encoded first (RFC 6749)
    assert endpoint.authorizations == [f"Basic {basic}"]
    assert endpoint.forms[0] == {"grant_type": "client_credentials", "scope": "push"}

    # a fresh token refused is not the token's fault: no new fetch
    assert not authenticator.rejected(auth, sent[0])
    authenticator._tokens[next(iter(authenticator._tokens))].fetched_at -= 5  # in use for 5 s
    # every push refused with it asks again: one new token, the others push with it
    retry = [authenticator.rejected(auth, h) for h in sent]
    assert all(retry)
    again = await asyncio.gather(*(authenticator.headers(auth) for _ in range(50)))
    assert {h["authorization"] for h in again} == {"Bearer t2"} and len(endpoint.forms) == 2
    await authenticator.close()


async def test_a_token_is_renewed_before_it_expires(endpoint: TokenEndpoint) -> None:
    endpoint.expires_in = 4
    authenticator = _authenticator()
    auth = _auth(endpoint, client_auth="body", audience="bus-api")
    first = await authenticator.headers(auth)
    [token] = authenticator._tokens.values()
    # 1.4 s early: a tenth of its life, and a second for issuers counting whole seconds
    assert token.renew_at - token.fetched_at == pytest.approx(2.6)
    assert await authenticator.headers(auth) == first
    assert token.use_until - token.fetched_at == pytest.approx(3.0)
    token.renew_at = token.fetched_at  # that time came: renewed in the background,
    assert await authenticator.headers(auth) == first  # the push goes on with the old one
    second = await eventually_async(
        lambda: (h := authenticator._tokens[next(iter(authenticator._tokens))]).value != "t1"
        and h, 5, "the token renewed in the background")
    assert second.value == "t2" and len(endpoint.forms) == 2
    second.renew_at = second.use_until = second.fetched_at  # expired: the push waits for one
    assert await authenticator.headers(auth) == {"authorization": "Bearer t3"}
    assert endpoint.forms[0] == {"grant_type": "client_credentials", "client_id": "bus:id",
                                 "client_secret": "s&cret", "audience": "bus-api"}
    assert endpoint.authorizations == ["", "", ""]
    await authenticator.close()


async def test_a_failing_token_endpoint_is_a_clear_error(endpoint: TokenEndpoint) -> None:
    authenticator = _authenticator()
    endpoint.status = 401
    failed_before = _fetches("failed")
    with pytest.raises(PushAuthError, match=re.escape("HTTP 401: {'error': 'invalid_client'}")):
        await authenticator.headers(_auth(endpoint))
    refused = PushAuth.model_validate({"oauth2": {
        "token_url": "http://10.1.2.3/token", "client_id": "c", "client_secret": "s"}})
    with pytest.raises(PushAuthError, match=r"OAuth2 token endpoint http://10\.1\.2\.3/token: .*"
                                            "private"):
        await authenticator.headers(refused)
    assert _fetches("failed") == failed_before + 2  # msgbus_push_token_fetches_total
    await authenticator.close()


def _fetches(outcome: str) -> float:
    return sum(sample.value for metric in PUSH_TOKEN_FETCHES.collect()
               for sample in metric.samples
               if sample.name.endswith("_total") and sample.labels["outcome"] == outcome)
