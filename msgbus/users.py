"""Admin users: roles, password hashing, API tokens and who is asking (`Principal`).

Bus-wide roles are ordered: a viewer sees the catalogue; an operator also reads and operates
everything (the bus's on-call); an admin also changes everything. Everyone else's rights come
from their teams (msgbus/teams.py); msgbus/permissions.py holds the rules.

Passwords are hashed with scrypt (memory-hard, in the standard library) and a random salt per
user; API tokens are 32 random bytes, so, like producer keys, a SHA-256 of them is stored.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, Field

from msgbus.teams import TeamRole

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
TOKEN_PREFIX = "mbt_"
MIN_PASSWORD_LENGTH = 10
USERNAME_PATTERN = r"^[a-z0-9][a-z0-9_.@-]{0,63}$"


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return list(Role).index(self)

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: a user (by session or API token) or the bootstrap token."""

    name: str
    role: Role
    via: str  # "session", "token", "bootstrap" (the shared admin token) or "cli"
    session_id: str | None = None
    teams: Mapping[str, TeamRole] = field(default_factory=dict)  # team -> role in it


class UserRecord(BaseModel):
    """A user as stored (`users` collection; `_id` is the name)."""

    name: Annotated[str, Field(alias="_id", pattern=USERNAME_PATTERN)]
    password_hash: str = Field(pattern=r"^scrypt\$")
    role: Role
    disabled: bool = False
    created_at: datetime
    updated_at: datetime


class TokenRecord(BaseModel):
    """An API token as stored (`api_tokens` collection; `_id` is the token's SHA-256)."""

    token_hash: Annotated[str, Field(alias="_id", pattern=r"^[0-9a-f]{64}$")]
    token_id: str
    user: str
    name: str
    role: Role
    created_at: datetime
    last_used_at: datetime | None = None
    expires_at: datetime | None = None  # None: made before 0.2, when tokens did not expire
    # a team's token (for automation): `user` is "team:<team>", and it acts as a `team_role`
    # of the team, and as a bus-wide viewer
    team: str | None = None
    team_role: TeamRole | None = None


def team_token_holder(team: str) -> str:
    """The `user` of a team's tokens (no user name has a colon)."""
    return f"team:{team}"


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ValueError(f"a password has at least {MIN_PASSWORD_LENGTH} characters")
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return "$".join(["scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P),
                     base64.b64encode(salt).decode(), base64.b64encode(digest).decode()])


def check_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        given = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n),
                               r=int(r), p=int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(given, base64.b64decode(digest))


def new_api_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_api_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_password() -> str:
    """A random password for a first admin (shown once)."""
    return secrets.token_urlsafe(15)
