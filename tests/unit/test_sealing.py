"""Sealed secrets (msgbus/sealing.py): what a copy of the database holds, and key rotation."""

from __future__ import annotations

import pytest

from msgbus.models import new_signing_secret
from msgbus.sealing import SecretKeyError, SecretKeys, key_id_of, new_key


def test_a_sealed_secret_names_its_key_hides_the_value_and_opens_again() -> None:
    keys = SecretKeys.parse(new_key("k1"))
    plain = new_signing_secret()
    sealed = keys.seal(plain)
    assert sealed.startswith("mbsealed:k1:") and plain not in sealed
    assert keys.seal(plain) != sealed  # a new IV each time: equal secrets are not seen equal
    assert keys.open(sealed) == plain and keys.seal(sealed) == sealed
    assert keys.open(plain) == plain  # stored before sealing: opens as itself


def test_a_newer_key_seals_and_an_older_one_still_opens_until_resealed() -> None:
    old_text, new_text = new_key("old"), new_key("new")
    old = SecretKeys.parse(old_text)
    sealed_old = old.seal("whsec_x")
    both = SecretKeys.parse(f"{new_text},{old_text}")
    assert both.current == "new"
    assert both.open(sealed_old) == "whsec_x"
    again = both.reseal(sealed_old)
    assert key_id_of(again) == "new" and both.open(again) == "whsec_x"
    assert both.reseal(again) == again  # already under the newest: unchanged
    with pytest.raises(SecretKeyError, match="key 'new', which is not among the keys given"):
        old.open(again)


def test_keys_that_do_not_parse_and_values_that_do_not_open_say_why() -> None:
    with pytest.raises(SecretKeyError, match="no secret key given"):
        SecretKeys.parse(" , ")
    with pytest.raises(SecretKeyError, match="written id:key"):
        SecretKeys.parse("just-a-key")
    with pytest.raises(SecretKeyError, match="'k1' is not a Fernet key"):
        SecretKeys.parse("k1:short")
    keys = SecretKeys.parse(new_key("k1"))
    tampered = keys.seal("whsec_x")[:-4] + "AAAA"
    with pytest.raises(SecretKeyError, match="does not open"):
        SecretKeys.parse(new_key("k1")).open(keys.seal("whsec_x"))  # another key, same id
    with pytest.raises(SecretKeyError, match="does not open"):
        keys.open(tampered)
