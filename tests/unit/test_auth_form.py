"""The subscription form's auth fields (admin/auth_form.py): every stored value by its input's
name, secrets only ever as the mask (the form sends it back to keep them), header rows with
room for more."""

from __future__ import annotations

from admin.auth_form import MIN_HEADER_ROWS, AuthFields, auth_fields
from msgbus.push_credentials import MASK, PushAuth
from msgbus.sealing import SecretKeys, new_key

CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_no_auth_gives_empty_fields_and_empty_header_rows() -> None:
    assert auth_fields(None) == AuthFields(values={}, headers=[("", "")] * MIN_HEADER_ROWS)


def test_stored_values_show_by_input_name_and_secrets_only_masked() -> None:
    keys = SecretKeys.parse(new_key("k1"))
    stored = PushAuth.model_validate({
        "headers": {"X-Api-Key": "plain-1", "X-Tenant": "plain-2"},
        "oauth2": {"token_url": "https://idp.example/token", "client_id": "bus",
                   "client_secret": "plain-3", "scope": "push", "client_auth": "body"},
        "tls": {"client_cert": CERT, "client_key": keys.seal("plain-4")},
    }).with_secrets(keys.seal)  # as loaded from the store: secrets sealed
    fields = auth_fields(stored)
    assert fields.values == {
        "auth.oauth2.token_url": "https://idp.example/token", "auth.oauth2.client_id": "bus",
        "auth.oauth2.client_secret": MASK, "auth.oauth2.scope": "push",
        "auth.oauth2.client_auth": "body",
        "auth.tls.client_cert": CERT, "auth.tls.client_key": MASK}
    assert fields.headers == [("X-Api-Key", MASK), ("X-Tenant", MASK), ("", "")]
    assert "mbsealed:" not in repr(fields) and "plain-" not in repr(fields)


def test_basic_shows_its_username_and_a_masked_password() -> None:
    fields = auth_fields(PushAuth.model_validate(
        {"basic": {"username": "bus", "password": "pw"}}))
    assert fields.values == {"auth.basic.username": "bus", "auth.basic.password": MASK}


def test_there_is_always_an_empty_header_row_to_add_one() -> None:
    full = PushAuth(headers={f"X-H{i}": "v" for i in range(MIN_HEADER_ROWS + 2)})
    rows = auth_fields(full).headers
    assert len(rows) == MIN_HEADER_ROWS + 3 and rows[-1] == ("", "")
    assert all(value == MASK for _, value in rows[:-1])
