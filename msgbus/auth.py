"""Producer API keys and shared-secret checks.

Keys are 32 random bytes, so a fast hash (SHA-256) is enough to store them safely; only the
hash is kept. Comparisons of shared secrets are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "mbk_"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def same_secret(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
