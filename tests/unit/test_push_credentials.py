"""A subscription's push authentication (msgbus/push_credentials.py): what is refused with a clear
message, how secrets are masked and kept, and how they are sealed."""

from __future__ import annotations

import pytest
from msgbus_devtools.testkit.certs import TestCa
from pydantic import ValidationError

from msgbus.models import Subscription
from msgbus.push_credentials import MASK, PushAuth
from msgbus.sealing import SecretKeys, is_sealed, new_key

OAUTH2 = {"token_url": "https://idp.example/token", "client_id": "bus", "client_secret": "s"}


def _refusal(auth: dict[str, object], url: str = "https://hooks.example/h") -> str:
    with pytest.raises(ValidationError) as caught:
        Subscription(destination="orders", name="billing", url=url, auth=auth)  # type: ignore[arg-type]
    return str(caught.value.errors()[0]["msg"])


@pytest.mark.parametrize(("auth", "says"), [
    ({"headers": {"ce-id": "x"}}, "set by the bus itself"),
    ({"headers": {"Webhook-Signature": "x"}}, "set by the bus itself"),
    ({"headers": {"Host": "x"}}, "set by the bus itself"),
    ({"headers": {"bad name": "x"}}, "not an HTTP token"),
    ({"headers": {"X-Key": "a\r\nInjected: 1"}}, "no line break"),
    ({"basic": {"username": "u", "password": "p"}, "headers": {"Authorization": "x"}},
     "set by basic or oauth2"),
    ({"basic": {"username": "u", "password": "p"}, "oauth2": OAUTH2}, "choose one"),
    ({"basic": {"username": "a:b", "password": "p"}}, "String should match"),
    ({"oauth2": OAUTH2 | {"client_auth": "jwt"}}, "'basic' or 'body'"),
    ({"tls": {}}, "a CA bundle, or both"),
    ({"tls": {"ca_bundle": "not a certificate"}}, "no usable PEM certificate"),
    ({"tls": {"ca_bundle": "-----BEGIN CERTIFICATE-----\nÿ\n"}}, "no usable PEM certificate"),
])
def test_a_wrong_auth_setting_is_refused_saying_what_is_wrong(
        auth: dict[str, object], says: str) -> None:
    assert says in _refusal(auth)


def test_a_client_key_that_is_not_the_certificates_is_refused() -> None:
    ca = TestCa()
    cert, other = ca.client(), ca.client("other")
    says = _refusal({"tls": {"client_cert": cert.cert, "client_key": other.key}})
    assert "do not load as a PEM certificate and its unencrypted key" in says
    assert "PRIVATE KEY" not in says  # the key itself is never in the message
    assert "https url only" in _refusal({"tls": {"ca_bundle": ca.pem}}, "http://hooks.example/h")


def test_secrets_are_masked_in_what_is_shown_and_a_mask_keeps_the_stored_value() -> None:
    stored = PushAuth.model_validate({"headers": {"X-Key": "k1"},
                                      "basic": {"username": "u", "password": "p1"}})
    shown = Subscription(destination="orders", name="billing", url="https://h.example/",  # type: ignore[arg-type]
                         auth=stored).shown()
    assert shown["auth"]["headers"] == {"X-Key": MASK} and "signing_secrets" not in shown
    assert shown["auth"]["basic"] == {"username": "u", "password": MASK}

    sent_back = PushAuth.model_validate(shown["auth"] | {"headers": {"X-Key": MASK,
                                                                    "X-New": "n"}})
    kept = sent_back.keeping(stored)
    assert kept.secret_places() == {"headers.X-Key": "k1", "headers.X-New": "n",
                                    "basic.password": "p1"}
    with pytest.raises(ValueError, match=r"auth\.oauth2\.client_secret"):
        PushAuth.model_validate({"oauth2": OAUTH2 | {"client_secret": MASK}}).keeping(stored)


def test_sealed_secrets_open_to_the_same_values_under_a_rotated_key() -> None:
    ca = TestCa()
    client = ca.client()
    auth = PushAuth.model_validate({"headers": {"X-Key": "k1"}, "oauth2": OAUTH2,
                                    "tls": {"client_cert": client.cert,
                                            "client_key": client.key}})
    old = SecretKeys.parse(new_key("old"))
    sealed = auth.with_secrets(old.seal)
    assert all(is_sealed(v) for v in sealed.secret_places().values())
    assert PushAuth.model_validate(sealed.model_dump()) == sealed  # a stored one validates
    both = SecretKeys.parse(f"{new_key('new')},{new_key('old').replace('old:', 'x:')}")
    both.keys["old"] = old.keys["old"]
    resealed = sealed.with_secrets(both.reseal)
    assert {v.split(":")[1] for v in resealed.secret_places().values()} == {"new"}
    assert resealed.with_secrets(both.open) == auth
