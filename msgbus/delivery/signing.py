"""Standard Webhooks signatures (https://www.standardwebhooks.com/) of subscriber pushes."""

from __future__ import annotations

import base64
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def secret_key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a signing secret starts with 'whsec_'")
    return base64.b64decode(secret[len(SECRET_PREFIX):])


def sign(secrets: list[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header: one `v1,<sig>` per secret (several during a rotation)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(secret_key(s), signed, hashlib.sha256).digest()).decode()
        for s in secrets
    )
