"""`msgbus subscription put`'s auth options (msgbus_cli/auth_options.py): the PUT body they
make, secrets from environment variables, files or a prompt and never from the command line,
the current auth (masked, as the API answers it) sent back for what no option changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from msgbus_cli.admin_client import AdminClient
from msgbus_cli.main import main as cli

MASK = "********"
CURRENT = {"destination": "orders", "name": "billing", "url": "https://billing.example/hook",
           "paused": False, "auth": {
               "headers": {"X-Api-Key": MASK, "X-Tenant": MASK},
               "basic": {"username": "bus", "password": MASK},
               "oauth2": None, "tls": None}}
ADMIN = ["--admin-url", "http://admin.invalid", "--token", "t", "-o", "json"]


class FakeApi:
    """The admin API's answers to `subscription put`: the current subscriptions, and the PUT
    body echoed (and kept)."""

    def __init__(self, current: list[dict[str, Any]]) -> None:
        self.current = current
        self.put: dict[str, Any] | None = None

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "GET":
            return self.current
        assert (method, path) == ("PUT", "/v1/destinations/orders/subscriptions/billing")
        self.put = kwargs["json"]
        return {**kwargs["json"], "signing_secrets": ["whsec_x"]}


def _put(monkeypatch: pytest.MonkeyPatch, *args: str, current: dict[str, Any] | None = None,
         env: dict[str, str] | None = None, input: str | None = None
         ) -> tuple[Result, dict[str, Any] | None]:
    api = FakeApi([current] if current is not None else [])
    monkeypatch.setattr(AdminClient, "call", lambda _, *a, **k: api.call(*a, **k))
    done = CliRunner().invoke(cli, ["subscription", "put", "orders", "billing", *ADMIN, *args],
                              env=env, input=input)
    return done, api.put


def _auth(done: Result, put: dict[str, Any] | None) -> Any:
    assert done.exit_code == 0, done.output
    assert put is not None
    return put["auth"]


def test_a_new_subscription_gets_headers_basic_and_a_ca_from_env_and_files(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n...\n")
    done, put = _put(monkeypatch, "--url", "https://b.example/hook",
                     "--header-env", "X-Api-Key=API_KEY", "--basic-user", "bus",
                     "--basic-password-env", "PW", "--tls-ca", str(ca),
                     env={"API_KEY": "k-1", "PW": "pw-1"})
    assert _auth(done, put) == {"headers": {"X-Api-Key": "k-1"},
                                "basic": {"username": "bus", "password": "pw-1"},
                                "tls": {"ca_bundle": "-----BEGIN CERTIFICATE-----\n...\n"}}


def test_without_auth_options_the_current_auth_goes_back_as_answered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done, put = _put(monkeypatch, "--max-concurrency", "4", current=CURRENT)
    assert _auth(done, put) == CURRENT["auth"]
    assert put is not None and put["max_concurrency"] == 4


def test_a_header_is_set_or_dropped_whatever_its_case_the_others_kept_masked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done, put = _put(monkeypatch, "--header-env", "x-api-key=NEW_KEY", "--drop-header",
                     "x-tenant", current=CURRENT, env={"NEW_KEY": "k-2"})
    assert _auth(done, put) == {"headers": {"x-api-key": "k-2"},
                                "basic": {"username": "bus", "password": MASK}}


def test_oauth2_replaces_basic_and_its_secret_not_given_nor_stored_is_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done, put = _put(monkeypatch, "--oauth2-token-url", "https://idp.example/token",
                     "--oauth2-client-id", "bus", "--oauth2-scope", "push",
                     "--oauth2-client-auth", "body", current=CURRENT, input="typed-secret\n")
    assert _auth(done, put) == {
        "headers": {"X-Api-Key": MASK, "X-Tenant": MASK},
        "oauth2": {"token_url": "https://idp.example/token", "client_id": "bus",
                   "scope": "push", "client_auth": "body", "client_secret": "typed-secret"}}
    assert done.output.startswith("OAuth2 client secret: \n")  # the typed secret not echoed


def test_a_stored_password_is_kept_when_only_the_username_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done, put = _put(monkeypatch, "--basic-user", "bus2", current=CURRENT)
    assert _auth(done, put)["basic"] == {"username": "bus2", "password": MASK}


def test_the_tls_key_comes_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("CERT")
    key.write_text("KEY")
    done, put = _put(monkeypatch, "--tls-cert", str(cert), "--tls-key", str(key),
                     current=CURRENT)
    assert _auth(done, put)["tls"] == {"client_cert": "CERT", "client_key": "KEY"}


def test_no_auth_removes_it_or_starts_the_new_one_from_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done, put = _put(monkeypatch, "--no-auth", current=CURRENT)
    assert _auth(done, put) is None
    done, put = _put(monkeypatch, "--no-auth", "--header-env", "X-Only=V", current=CURRENT,
                     env={"V": "v-1"})
    assert _auth(done, put) == {"headers": {"X-Only": "v-1"}}
    done, put = _put(monkeypatch, "--drop-header", "X-Api-Key", "--drop-header", "X-Tenant",
                     current={**CURRENT, "auth": {"headers": {"X-Api-Key": MASK,
                                                              "X-Tenant": MASK}}})
    assert _auth(done, put) is None  # nothing left


@pytest.mark.parametrize(("args", "says"), [
    (["--basic-password-env", "UNSET_VAR"], "environment variable UNSET_VAR is not set"),
    (["--header-env", "X-Api-Key"], "is not NAME=VAR"),
    (["--basic-user", "u", "--oauth2-client-id", "c"], "choose one"),
    (["--basic-password", "pw"], "No such option"),  # secrets are no option's value
])
def test_wrong_auth_options_put_nothing(monkeypatch: pytest.MonkeyPatch, args: list[str],
                                        says: str) -> None:
    done, put = _put(monkeypatch, *args, current=CURRENT)
    assert done.exit_code == 2 and says in done.stderr
    assert put is None


@pytest.mark.parametrize(("given", "sent"), [("3", 3), ("all", None), ("ALL", None)])
def test_dispatchers_is_a_number_or_all(monkeypatch: pytest.MonkeyPatch, given: str,
                                        sent: int | None) -> None:
    done, put = _put(monkeypatch, "--dispatchers", given, current=CURRENT)
    assert done.exit_code == 0, done.output
    assert put is not None and put["dispatchers"] == sent
    refused, nothing = _put(monkeypatch, "--dispatchers", "some", current=CURRENT)
    assert refused.exit_code == 2 and "neither a number nor 'all'" in refused.output
    assert nothing is None
