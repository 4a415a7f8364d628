"""Who is asking, and may they: sessions, API tokens, the bootstrap token, roles and CSRF.

A request is authenticated by, in this order:
- `Authorization: Bearer <token>`: the bootstrap token (`MSGBUS_ADMIN_TOKEN`, role admin, for
  first set-up and automation that predates users) or a user's API token (`mbt_...`);
- the session cookie set by `POST /v1/session` (user name and password): signed, expiring
  after `session_ttl_s`. A request that changes something with a session cookie must carry
  the session's CSRF token in `X-CSRF-Token` (or a `csrf_token` form field), which a page of
  another site cannot read.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import orjson
from fastapi import Request
from fastapi.security import APIKeyCookie, HTTPBearer

from msgbus.auth import bearer_token, same_secret
from msgbus.errors import Forbidden, MongoUnavailable, Unauthorized
from msgbus.store.gate import MongoGate
from msgbus.store.teams import TeamStore
from msgbus.store.users import UserStore
from msgbus.throttle import Policy, Throttle
from msgbus.users import Principal, Role, check_password, hash_api_token

SESSION_COOKIE = "msgbus_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# a busy MongoDB answers sign-ins slowly; with the outage guard's ping (admin/outage.py) a
# hung one still costs a request under 3 s
AUTH_TIMEOUT_S = 2.0
KNOWN_FOR_S = 600.0  # how old a remembered principal may be while MongoDB is unavailable
MAX_KNOWN = 10_000

# The credentials as the OpenAPI document shows them (either one); Authenticator reads them.
BEARER_AUTH = HTTPBearer(
    scheme_name="bearerAuth", auto_error=False,
    description="the bootstrap token (MSGBUS_ADMIN_TOKEN) or a user's API token (mbt_...)")
SESSION_AUTH = APIKeyCookie(
    name=SESSION_COOKIE, scheme_name="sessionCookie", auto_error=False,
    description=f"the session of POST /v1/session; a change also needs the {CSRF_HEADER} "
                "header")


class Sessions:
    """Signed, expiring session cookies; nothing is stored server-side."""

    def __init__(self, secret: str, ttl_s: float) -> None:
        self._key = hashlib.sha256(b"msgbus-session:" + secret.encode()).digest()
        self.ttl_s = ttl_s

    def sign(self, payload: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self._key, payload, "sha256").digest()
                                        ).decode().rstrip("=")

    def seal(self, data: dict[str, Any], purpose: bytes = b"") -> str:
        """`data` (with an "exp" epoch) as a signed cookie value; `purpose` keeps a value made
        for one use from being taken for another."""
        payload = orjson.dumps(data)
        encoded = base64.urlsafe_b64encode(payload).decode().rstrip("=")
        return f"{encoded}.{self.sign(purpose + payload)}"

    def unseal(self, cookie: str, purpose: bytes = b"") -> dict[str, Any] | None:
        """The data of a value `seal` made for `purpose`, unless forged or expired."""
        encoded, _, signature = cookie.partition(".")
        try:
            payload = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            data = orjson.loads(payload)
        except (ValueError, orjson.JSONDecodeError):
            return None
        if not hmac.compare_digest(signature, self.sign(purpose + payload)):
            return None
        if not isinstance(data, dict) or data.get("exp", 0) < time.time():
            return None
        return data

    def issue(self, user: str) -> tuple[str, str]:
        """A cookie value for `user`, and its session id."""
        session_id = secrets.token_urlsafe(16)
        cookie = self.seal({"u": user, "sid": session_id, "exp": int(time.time() + self.ttl_s)})
        return cookie, session_id

    def read(self, cookie: str) -> tuple[str, str] | None:
        """(user, session id) of a valid, unexpired cookie; None otherwise."""
        data = self.unseal(cookie)
        return None if data is None else (str(data["u"]), str(data["sid"]))

    def csrf_token(self, session_id: str) -> str:
        return self.sign(b"csrf:" + session_id.encode())


def signin_policies(lock_first_s: float, lock_max_s: float,
                    address_lock_after: int) -> dict[str, Policy]:
    """A user at one address is locked after 6 failures, an address (wrong passwords of any
    user, wrong API tokens) after `address_lock_after`; a user from anywhere is only slowed
    (msgbus/throttle.py says why)."""
    locks = {"lock_first_s": lock_first_s, "lock_max_s": lock_max_s}
    return {"user-address": Policy(free=3, slow_max_s=2.0, lock_after=6, **locks),
            "address": Policy(free=min(10, address_lock_after), slow_max_s=0.5,
                              lock_after=address_lock_after, **locks),
            "user": Policy(free=5, slow_max_s=4.0, lock_after=None, **locks)}


def client_address(request: Request) -> str:
    """The caller's address (behind a proxy named in FORWARDED_ALLOW_IPS, the one it
    forwards: uvicorn puts it here)."""
    return request.client.host if request.client is not None else "unknown"


async def failed(throttle: Throttle, keys: dict[str, str], error: Exception) -> NoReturn:
    """Counts the failure, waits what the throttle says, then raises `error`."""
    await asyncio.sleep(await throttle.failed(keys))
    raise error


class SignIns:
    """Passwords, checked under the sign-in throttle."""

    def __init__(self, users: UserStore, throttle: Throttle) -> None:
        self._users = users
        self.throttle = throttle

    async def user(self, name: str, password: str, address: str) -> dict[str, Any]:
        """The user `name` if `password` is theirs; TooManyAttempts (429) while locked out,
        without looking at the password; else Unauthorized after the throttle's delay."""
        keys = {"user-address": f"{name}|{address}", "address": address, "user": name}
        await self.throttle.check(keys)
        user = await self._users.find_user(name)
        if (user is None or user.get("disabled")
                or not check_password(password, user["password_hash"])):
            await failed(self.throttle, keys, Unauthorized("wrong user name or password"))
        await self.throttle.succeeded({k: keys[k] for k in ("user-address", "user")})
        return user


class Authenticator:
    def __init__(self, users: UserStore, teams: TeamStore, sessions: Sessions,
                 bootstrap_token: str, gate: MongoGate, throttle: Throttle) -> None:
        self._users = users
        self._teams = teams
        self._throttle = throttle
        # reads a company session's groups again when due (admin/oidc.py); None: no company
        # sign-in
        self.refresh_company_session: Callable[[str], Awaitable[None]] | None = None
        self.sessions = sessions
        self._bootstrap = bootstrap_token
        self._gate = gate
        # by "token:<hash>" or "user:<name>": (when MongoDB last confirmed it, the principal)
        self._known: dict[str, tuple[float, Principal]] = {}

    async def principal(self, request: Request) -> Principal:
        token = bearer_token(request.headers.get("authorization"))
        if token is not None:
            if self._bootstrap and same_secret(token, self._bootstrap):
                return Principal(name="admin-token", role=Role.ADMIN, via="bootstrap")
            found = await self._remembered(f"token:{hash_api_token(token)}",
                                           lambda: self._with_teams(
                                               self._users.principal_for_token(token)))
            if found is None:
                address = {"address": client_address(request)}
                await self._throttle.check(address)  # 429 once its address is locked
                await failed(self._throttle, address,
                             Unauthorized("unknown or revoked API token"))
            return found
        cookie = request.cookies.get(SESSION_COOKIE)
        session = self.sessions.read(cookie) if cookie else None
        if session is None:
            raise Unauthorized("log in (POST /v1/session) or send an API token"
                               if not cookie else "session expired or invalid; log in again")
        name, session_id = session
        if self.refresh_company_session is not None:
            await self.refresh_company_session(session_id)
        user = await self._remembered(f"user:{name}",
                                      lambda: self._with_teams(self._session_user(name)))
        if user is None:
            raise Unauthorized("session of a user that no longer exists or is disabled")
        if request.method not in SAFE_METHODS:
            await self._check_csrf(request, session_id)
        return dataclasses.replace(user, session_id=session_id)

    async def _with_teams(self, looked_up: Awaitable[Principal | None]) -> Principal | None:
        """The principal with its teams, read afresh: a member removed from a team loses its
        rights with the next request."""
        principal = await looked_up
        if principal is None:
            return None
        teams = {**principal.teams, **await self._teams.roles_of(principal.name)}
        return dataclasses.replace(principal, teams=teams)

    async def _session_user(self, name: str) -> Principal | None:
        user = await self._users.find_user(name)
        if user is None or user.get("disabled"):
            return None
        return Principal(name=name, role=Role(user["role"]), via="session")

    async def _remembered(self, key: str,
                          lookup: Callable[[], Awaitable[Principal | None]]) -> Principal | None:
        """`lookup()` through the gate, within AUTH_TIMEOUT_S; while MongoDB is unavailable,
        what it last returned (at most KNOWN_FOR_S ago), else MongoUnavailable."""
        try:
            async with self._gate.guard("authentication", AUTH_TIMEOUT_S):
                found = await lookup()
        except MongoUnavailable:
            known = self._known.get(key)
            if known is None or time.monotonic() - known[0] > KNOWN_FOR_S:
                raise
            return known[1]
        if found is None:
            self._known.pop(key, None)
        else:
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()  # random tokens must not grow memory without bound
            self._known[key] = (time.monotonic(), found)
        return found

    async def _check_csrf(self, request: Request, session_id: str) -> None:
        given = request.headers.get(CSRF_HEADER)
        if given is None and request.headers.get("content-type", "").startswith(
                "application/x-www-form-urlencoded"):
            form = await request.form()
            value = form.get("csrf_token")
            given = value if isinstance(value, str) else None
        if not same_secret(given, self.sessions.csrf_token(session_id)):
            raise Forbidden(f"missing or wrong CSRF token (send {CSRF_HEADER})")
