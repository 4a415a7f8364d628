"""Verify pushes from the msgbus dispatcher (Standard Webhooks signatures), for subscribers.

    from msgbus_client.verify import verify_push
    verify_push(secret, request.headers, await request.body())  # raises if not authentic

The dispatcher signs `f"{webhook-id}.{webhook-timestamp}.".encode() + body` with HMAC-SHA256,
keyed by the base64-decoded part of the subscription secret after `whsec_`, and sends
`webhook-signature: v1,<base64 signature>` (several space-separated entries while secrets are
rotated). Verify against the raw body bytes, before parsing them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

from msgbus_client.errors import WebhookVerificationError

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300


def _secret_key(secret: str) -> bytes:
    raw = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("the signing secret is not 'whsec_' + base64") from exc
    if not key:
        raise ValueError("the signing secret is empty")
    return key


def sign_push(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value (`v1,<base64>`) for a push; what the dispatcher sends."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(_secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify_push(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    *,
    now_s: float | None = None,
) -> None:
    """Check a push's Standard Webhooks signature and timestamp; raise if it is not authentic.

    `headers` may use any letter case. Raises WebhookVerificationError when a header is missing,
    the timestamp is further than `tolerance_s` from now (replay protection), or no `v1`
    signature matches; ValueError when `secret` itself is malformed.
    """
    key = _secret_key(secret)
    lower = {name.lower(): value for name, value in headers.items()}
    webhook_id = _required(lower, "webhook-id")
    raw_timestamp = _required(lower, "webhook-timestamp")
    signatures = _required(lower, "webhook-signature")
    try:
        timestamp = int(raw_timestamp.strip())
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    now = time.time() if now_s is None else now_s
    if abs(now - timestamp) > tolerance_s:
        raise WebhookVerificationError(
            f"webhook-timestamp is {now - timestamp:+.0f} s from now (tolerance {tolerance_s} s)"
        )
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    expected = hmac.new(key, signed, hashlib.sha256).digest()
    matched = False
    for part in signatures.split():
        version, _, encoded = part.partition(",")
        if version != "v1":
            continue
        try:
            candidate = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        # keep comparing after a match so timing does not tell which entry matched
        matched |= hmac.compare_digest(candidate, expected)
    if not matched:
        raise WebhookVerificationError("no valid v1 signature in webhook-signature")


def _required(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if not value:
        raise WebhookVerificationError(f"missing header {name}")
    return value
