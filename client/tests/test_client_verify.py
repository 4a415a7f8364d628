"""verify_push(): Standard Webhooks signatures as subscribers check them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import pytest

from msgbus_client import WebhookVerificationError, sign_push, verify_push

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef01234567").decode()
BODY = b'{"order_id": 42}'


def signed_headers(body: bytes = BODY, timestamp: int | None = None) -> dict[str, str]:
    ts = int(time.time()) if timestamp is None else timestamp
    # computed here by hand, independent of sign_push()
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    digest = hmac.new(key, f"msg_1.{ts}.".encode() + body, hashlib.sha256).digest()
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(ts),
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


def test_correct_signature_is_accepted() -> None:
    verify_push(SECRET, signed_headers(), BODY)


def test_header_names_are_case_insensitive() -> None:
    headers = {k.title(): v for k, v in signed_headers().items()}
    verify_push(SECRET, headers, BODY)


def test_one_matching_entry_among_several_is_enough() -> None:
    headers = signed_headers()
    wrong = "v1," + base64.b64encode(b"x" * 32).decode()
    headers["webhook-signature"] = f"{wrong} v2,abc {headers['webhook-signature']}"
    verify_push(SECRET, headers, BODY)


def test_sign_push_matches_the_reference() -> None:
    headers = signed_headers(timestamp=1_700_000_000)
    assert sign_push(SECRET, "msg_1", 1_700_000_000, BODY) == headers["webhook-signature"]


def test_tampered_body_is_rejected() -> None:
    with pytest.raises(WebhookVerificationError, match="signature"):
        verify_push(SECRET, signed_headers(), b'{"order_id": 43}')


def test_old_timestamp_is_rejected_even_when_signed() -> None:
    old = int(time.time()) - 301
    with pytest.raises(WebhookVerificationError, match="timestamp"):
        verify_push(SECRET, signed_headers(timestamp=old), BODY)
    verify_push(SECRET, signed_headers(timestamp=old), BODY, tolerance_s=600)


def test_future_timestamp_is_rejected() -> None:
    with pytest.raises(WebhookVerificationError, match="timestamp"):
        verify_push(SECRET, signed_headers(timestamp=int(time.time()) + 1000), BODY)


def test_other_secret_is_rejected() -> None:
    other = "whsec_" + base64.b64encode(b"another secret of 24 byte").decode()
    with pytest.raises(WebhookVerificationError):
        verify_push(other, signed_headers(), BODY)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_header_is_rejected(missing: str) -> None:
    headers = signed_headers()
    del headers[missing]
    with pytest.raises(WebhookVerificationError, match=missing):
        verify_push(SECRET, headers, BODY)


def test_malformed_secret_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        verify_push("whsec_not base64!", signed_headers(), BODY)
