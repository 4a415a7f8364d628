"""Pushes authenticate as their subscribers require (issue 40 part 2): OAuth2 client credentials
from a real authorization server (npm oidc-provider, tests/tools/oauth2-server.mjs, JWT access
tokens that live 4 s), Basic with a static API-key header, and mutual TLS with a CA made in the
test. Every subscriber checks the credentials and the signature of each push; tokens expire
during the run and one is revoked, which costs one new token, not one per push. Secrets are
stored sealed and answered masked; a failing authentication step is a failed attempt with a
clear error, retried like any other."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.errors import ExpiredTokenError, JoseError
from joserfc.jwk import KeySet
from msgbus_client.verify import verify_push
from msgbus_devtools.servers import free_port, stop, wait_for_port
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.certs import ServerTls, TestCa
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.subscriber import CheckingSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus.push_credentials import MASK

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "tools" / "oauth2-server.mjs"
RESOURCE = "https://subscriber.test/"
TOKEN_TTL_S = 4
MESSAGES = 1000
CONCURRENCY = 8


@dataclass
class OAuth2Server:
    url: str
    log: Path
    clients: dict[str, str]  # client_id -> secret

    @property
    def token_url(self) -> str:
        return f"{self.url}/token"

    def issued(self, client_id: str) -> int:
        """Tokens issued to `client_id` so far (the server tells each on its stdout)."""
        return self.log.read_text().splitlines().count(f"issued {client_id}")

    def keys(self) -> KeySet:
        return KeySet.import_key_set(httpx.get(f"{self.url}/jwks", timeout=10).json())


def start_oauth2_server(tmp_path: Path, port: int) -> tuple[OAuth2Server, subprocess.Popen[bytes]]:
    clients = {"bus-basic": f"basic-{uuid.uuid4().hex}", "bus-post": f"post-{uuid.uuid4().hex}"}
    config = tmp_path / "oauth2.json"
    config.write_text(json.dumps({"resource": RESOURCE, "ttl_s": TOKEN_TTL_S, "clients": [
        {"client_id": "bus-basic", "client_secret": clients["bus-basic"]},
        {"client_id": "bus-post", "client_secret": clients["bus-post"],
         "token_endpoint_auth_method": "client_secret_post"}]}))
    log = tmp_path / f"oauth2-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(["node", str(SERVER), str(port), str(config)],
                                   stdout=out, stderr=subprocess.STDOUT)
    wait_for_port("127.0.0.1", port, 30)
    return OAuth2Server(f"http://127.0.0.1:{port}", log, clients), process


@pytest.fixture
def oauth2(tmp_path: Path) -> Iterator[OAuth2Server]:
    server, process = start_oauth2_server(tmp_path, free_port())
    yield server
    stop(process.pid)


@dataclass
class BearerCheck:
    """A resource server's check of OAuth2 access tokens: signed by the server's keys, for
    this resource, not expired, not revoked."""

    keys: KeySet
    issuer: str
    first_seen: dict[str, float] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    refusals: dict[str, int] = field(default_factory=dict)  # by reason

    def __call__(self, headers: dict[str, str]) -> bool:
        kind, _, token = headers.get("authorization", "").partition(" ")
        if kind != "Bearer":
            return self._refused("no bearer token")
        if token in self.revoked:
            return self._refused("revoked")
        try:
            claims = jwt.decode(token, self.keys, algorithms=["RS256"]).claims
            jwt.JWTClaimsRegistry(iss={"essential": True, "value": self.issuer},
                                  aud={"essential": True, "value": RESOURCE},
                                  exp={"essential": True}).validate(claims)
        except ExpiredTokenError:
            return self._refused("expired")
        except JoseError as exc:
            return self._refused(type(exc).__name__)
        self.first_seen.setdefault(token, time.monotonic())
        return True

    def _refused(self, reason: str) -> bool:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        return False

    def revoke_newest(self, older_than_s: float) -> str | None:
        """Revokes the newest token once it has been in use for `older_than_s`."""
        token, seen = max(self.first_seen.items(), key=lambda item: item[1],
                          default=(None, 0.0))
        if token is None or time.monotonic() - seen < older_than_s:
            return None
        self.revoked.add(token)
        return token


def basic_check(user: str, password: str, api_key: str) -> Callable[[dict[str, str]], bool]:
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return lambda h: h.get("authorization") == expected and h.get("x-api-key") == api_key


def _send_paced(bus: RunningBus, api_key: str, destinations: list[str], seconds: float,
                revoke_at: float, revoke: Callable[[], None]) -> None:
    """MESSAGES to each destination, spread over `seconds` (tokens expire meanwhile);
    `revoke` once `revoke_at` of them went out."""
    waves = 20
    per_wave = MESSAGES // waves
    revoked = False
    started = time.monotonic()
    for wave in range(waves):
        post_batches(bus.receiver_url, api_key, [
            {"message_id": uuid7(), "destination": code, "body": {"n": wave * per_wave + n}}
            for code in destinations for n in range(per_wave)], batch_size=100)
        if not revoked and (wave + 1) / waves >= revoke_at:
            revoke()
            revoked = True
        # pace the load, not a wait for a condition: the next wave is due at its time
        time.sleep(max(0.0, started + seconds * (wave + 1) / waves - time.monotonic()))


def test_subscribers_requiring_oauth2_basic_or_mutual_tls_receive_every_message(
        bus: RunningBus, api_key: str, oauth2: OAuth2Server, tmp_path: Path) -> None:
    ca = TestCa()
    server_cert, server_key = ca.server().write(tmp_path, "subscriber")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text(ca.pem)
    client = ca.client()
    keys = oauth2.keys()
    tag = uuid.uuid4().hex[:6]
    kafka, rabbit = f"auth-k-{tag}", f"auth-r-{tag}"
    password, header_value = f"pw-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    bearer: dict[str, BearerCheck] = {}
    subscribers: dict[str, CheckingSubscriber] = {}
    secrets: dict[str, str] = {}
    for code, broker, client_id in ((kafka, "kafka", "bus-basic"),
                                    (rabbit, "rabbitmq", "bus-post")):
        bus.create_destination(code, broker)
        bearer[code] = BearerCheck(keys, oauth2.url)
        kinds: dict[str, tuple[CheckingSubscriber, dict[str, Any], ServerTls | None]] = {
            "oauth": (CheckingSubscriber(bearer[code]), {"oauth2": {
                "token_url": oauth2.token_url, "client_id": client_id,
                "client_secret": oauth2.clients[client_id], "scope": "push",
                "resource": RESOURCE,
                "client_auth": "basic" if client_id == "bus-basic" else "body"}}, None),
            "basic": (CheckingSubscriber(basic_check("bus", password, header_value)),
                      {"basic": {"username": "bus", "password": password},
                       "headers": {"X-Api-Key": header_value}}, None),
            "mtls": (CheckingSubscriber(lambda _: True), {"tls": {
                "client_cert": client.cert, "client_key": client.key, "ca_bundle": ca.pem}},
                ServerTls(server_cert, server_key, client_ca_file=ca_file)),
        }
        for name, (subscriber, auth, tls) in kinds.items():
            made = bus.subscribe(code, name, bus.serve_subscriber(subscriber, tls), auth=auth,
                                 max_concurrency=CONCURRENCY,
                                 retry_policy={"delays_s": [0.5]})
            subscribers[f"{code}/{name}"] = subscriber
            secrets[f"{code}/{name}"] = made["signing_secrets"][0]
            assert MASK in json.dumps(made["auth"]), made["auth"]
    bus.wait_for_workers(list(subscribers))

    revoked: list[str] = []
    fetched_before = {c: oauth2.issued(c) for c in oauth2.clients}

    def revoke() -> None:
        for check in bearer.values():
            token = eventually(lambda check=check: check.revoke_newest(older_than_s=1.5),
                               10, "a token in use for 1.5 s")
            revoked.append(token)

    started = time.monotonic()
    _send_paced(bus, api_key, [kafka, rabbit], seconds=10, revoke_at=0.5, revoke=revoke)
    for sub_id, subscriber in subscribers.items():
        eventually(lambda s=subscriber: len(s.message_ids()) >= MESSAGES, 90,
                   f"every message at {sub_id}",
                   progress=lambda s=subscriber: f"{len(s.message_ids())} received")
    elapsed = time.monotonic() - started

    for sub_id, subscriber in subscribers.items():
        assert len(subscriber.message_ids()) == MESSAGES, sub_id
        for headers, body in subscriber.accepted[:50]:  # signed as ever
            verify_push(secrets[sub_id], headers, body)
    for code, check in bearer.items():
        assert len(check.first_seen) >= 3, f"{code}: tokens did not expire during the run"
        # the pushes in flight with the revoked token were refused, and no more (the dispatcher's
        # and the compensator's); a token is renewed before it expires
        assert check.refusals.get("revoked", 0) <= 2 * CONCURRENCY, (code, check.refusals)
        assert set(check.refusals) <= {"revoked", "expired"}, check.refusals
        assert check.refusals.get("expired", 0) <= 2 * CONCURRENCY, (code, check.refusals)
    fetched = {c: oauth2.issued(c) - fetched_before[c] for c in oauth2.clients}
    # each pushing process renews its token before it expires (at 0.9 of 4 s) and once after
    # the revocation: nowhere near one fetch per push
    most = 2 * (elapsed / (0.9 * TOKEN_TTL_S) + 3)
    assert all(n <= most for n in fetched.values()), (fetched, elapsed)
    print(f"\npush auth: {MESSAGES} messages x 6 subscriptions in {elapsed:.1f} s; tokens "
          f"fetched {fetched}; refused {[check.refusals for check in bearer.values()]}")

    plain = {password, header_value, client.key.splitlines()[1], *oauth2.clients.values()}
    assert not bus.documents_holding(plain)
    shown = bus.admin.get("/v1/subscriptions", params={"destination": kafka}).json()
    text = json.dumps(shown)
    assert not any(value in text for value in plain) and MASK in text



def test_a_failing_authentication_step_is_a_failed_attempt_with_a_clear_error_then_retried(
        bus: RunningBus, api_key: str, tmp_path: Path) -> None:
    """The token endpoint is down, and the client certificate is one the subscriber's CA did
    not sign: each attempt fails with an error that says so. Once the endpoint is up and the
    certificate replaced, the retries deliver the message."""
    token_port = free_port()
    ca, stranger = TestCa(), TestCa("a CA the subscriber does not know").client()
    server_cert, server_key = ca.server().write(tmp_path, "subscriber")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text(ca.pem)
    code = f"auth-fail-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "rabbitmq")
    bearer = CheckingSubscriber(lambda h: h.get("authorization", "").startswith("Bearer "))
    mutual = CheckingSubscriber(lambda _: True)
    oauth2 = {"token_url": f"http://127.0.0.1:{token_port}/token", "client_id": "bus-basic",
              "client_secret": "not-known-yet", "resource": RESOURCE}
    retry = {"delays_s": [0.5]}
    bus.subscribe(code, "oauth", bus.serve_subscriber(bearer), auth={"oauth2": oauth2},
                  retry_policy=retry)
    mtls_url = bus.serve_subscriber(mutual, ServerTls(server_cert, server_key, ca_file))
    bus.subscribe(code, "mtls", mtls_url, retry_policy=retry, auth={"tls": {
        "client_cert": stranger.cert, "client_key": stranger.key, "ca_bundle": ca.pem}})
    bus.wait_for_workers([f"{code}/oauth", f"{code}/mtls"])
    message_id = uuid7()
    post_batches(bus.receiver_url, api_key, [{"message_id": message_id, "destination": code,
                                              "body": {"n": 1}}])

    def errors() -> dict[str, list[str]]:
        return {d["subscription"]: [a.get("error") or "" for a in d["attempts_log"]]
                for d in bus.deliveries(message_id)}

    failed = eventually(lambda: (e := errors()) and len(e.get(f"{code}/oauth", [])) >= 2
                        and len(e.get(f"{code}/mtls", [])) >= 2 and e, 60,
                        "two failed attempts each")
    assert all(f"OAuth2 token endpoint http://127.0.0.1:{token_port}/token" in error
               for error in failed[f"{code}/oauth"]), failed
    assert all("client certificate" in error for error in failed[f"{code}/mtls"]), \
        failed
    assert not bearer.accepted and not mutual.accepted

    server, process = start_oauth2_server(tmp_path, token_port)
    try:
        bus.subscribe(code, "oauth", bus.serve_subscriber(bearer), retry_policy=retry,
                      auth={"oauth2": oauth2 | {"client_secret": server.clients["bus-basic"]}})
        good = ca.client()
        bus.subscribe(code, "mtls", mtls_url, retry_policy=retry, auth={"tls": {
            "client_cert": good.cert, "client_key": good.key, "ca_bundle": ca.pem}})
        eventually(lambda: message_id in bearer.message_ids()
                   and message_id in mutual.message_ids(), 30, "the retries delivered")
    finally:
        stop(process.pid)


def test_a_masked_secret_sent_back_keeps_the_stored_one(bus: RunningBus) -> None:
    """A form saved unchanged sends '********' back: the stored secret stays; a mask where
    nothing is stored is a 422 naming it."""
    code = f"auth-keep-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    password, api_key = f"pw-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    subscriber = CheckingSubscriber(basic_check("bus", password, api_key))
    url = bus.serve_subscriber(subscriber)
    auth = {"basic": {"username": "bus", "password": password},
            "headers": {"X-Api-Key": api_key}}
    shown = bus.subscribe(code, "keep", url, auth=auth)["auth"]
    assert shown["basic"] == {"username": "bus", "password": MASK}
    assert shown["headers"] == {"X-Api-Key": MASK}
    again = bus.subscribe(code, "keep", url, auth=shown, timeout_ms=3000)
    assert again["timeout_ms"] == 3000
    tested = bus.admin.post(f"/v1/destinations/{code}/subscriptions/keep/test").json()
    assert tested["ok"], tested  # still the first password and key
    refused = bus.admin.put(f"/v1/destinations/{code}/subscriptions/new", json={
        "url": url, "auth": {"basic": {"username": "bus", "password": MASK}}})
    assert refused.status_code == 422 and "basic.password" in refused.json()["message"]
    audit = bus.admin.get("/v1/audit", params={"target": f"{code}/keep"}).text
    assert "subscription.put" in audit and password not in audit and api_key not in audit
