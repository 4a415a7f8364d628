"""Company sign-in: OpenID Connect, authorization code with PKCE (joserfc checks the ID token).

    /ui/oidc/start ──▶ the provider's sign-in (state, nonce and the PKCE verifier wait in a
                       signed cookie for 10 minutes)
    /ui/oidc/callback ◀── code ──▶ tokens (client secret, verifier) ──▶ the ID token checked
                       (signature by the provider's keys, issuer, audience, expiry, nonce)
                       ──▶ the person: user name, bus-wide role and teams from their groups
                       ──▶ a session, like a password's, and its refresh token kept encrypted

Every `refresh_s` a session's next request reads the person's groups again with the refresh
token: a person taken out of a group loses that team's rights then; one the provider no longer
knows (or whose refresh fails) is signed out. Local users stay for the embedded `msgbus up`
and for break-glass admins.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from admin.security import Sessions
from msgbus.errors import Unauthorized
from msgbus.models import utcnow
from msgbus.sealing import SecretKeys
from msgbus.settings import OidcSettings
from msgbus.store import MongoStore
from msgbus.store.users import UserStore
from msgbus.teams import TeamRole
from msgbus.users import USERNAME_PATTERN, Role, hash_password, new_password

FLOW_COOKIE = "msgbus_oidc_flow"
FLOW_TTL_S = 600
FLOW_PURPOSE = b"oidc-flow:"
HTTP_TIMEOUT_S = 10.0
CALLBACK_PATH = "/ui/oidc/callback"
ID_TOKEN_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"]


def _s256(verifier: str) -> str:
    """The PKCE code challenge of `verifier` (RFC 7636, S256)."""
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class CompanySignIn:
    def __init__(self, settings: OidcSettings, store: MongoStore, users: UserStore,
                 sessions: Sessions, keys: SecretKeys) -> None:
        self.settings = settings
        self._store, self._users, self._sessions = store, users, sessions
        self._keys = keys  # the refresh tokens are stored sealed
        self._metadata: dict[str, Any] | None = None

    @property
    def redirect_uri(self) -> str:
        return self.settings.base_url.rstrip("/") + CALLBACK_PATH

    # --- the sign-in ----------------------------------------------------------------------

    async def start(self) -> tuple[str, str]:
        """The provider's sign-in URL, and the flow cookie's value."""
        meta = await self.metadata()
        state, nonce, verifier = (secrets.token_urlsafe(24), secrets.token_urlsafe(24),
                                  secrets.token_urlsafe(48))
        query = {"response_type": "code", "client_id": self.settings.client_id,
                 "redirect_uri": self.redirect_uri, "scope": self.settings.scopes,
                 "state": state, "nonce": nonce,
                 "code_challenge": _s256(verifier),
                 "code_challenge_method": "S256",
                 **({"prompt": self.settings.prompt} if self.settings.prompt else {})}
        flow = self._sessions.seal({"state": state, "nonce": nonce, "verifier": verifier,
                                    "exp": int(time.time()) + FLOW_TTL_S}, FLOW_PURPOSE)
        return f"{meta['authorization_endpoint']}?{urlencode(query)}", flow

    async def finish(self, code: str, state: str, flow_cookie: str | None
                     ) -> tuple[str, str, dict[str, Any]]:
        """The session cookie, its id, and the user of a sign-in that came back with `code`."""
        flow = self._sessions.unseal(flow_cookie, FLOW_PURPOSE) if flow_cookie else None
        if flow is None or not hmac.compare_digest(flow["state"], state):
            raise Unauthorized("the sign-in expired or did not start here; sign in again")
        token = await self._token({"grant_type": "authorization_code", "code": code,
                                   "redirect_uri": self.redirect_uri,
                                   "code_verifier": flow["verifier"]})
        claims = await self._claims(token, nonce=flow["nonce"])
        user = await self._follow(claims)
        cookie, session_id = self._sessions.issue(user["_id"])
        await self._store.company_sessions.save(
            session_id, user["_id"], token.get("refresh_token"), self._next_refresh(),
            utcnow() + timedelta(seconds=self._sessions.ttl_s), self._keys)
        return cookie, session_id, user

    async def refresh_if_due(self, session_id: str) -> None:
        """Reads the groups of a company session again when due; Unauthorized when the
        provider no longer signs the person in. Local sessions are left alone."""
        session = await self._store.company_sessions.get(session_id)
        if session is None or session["refresh_at"].timestamp() > time.time():
            return
        refresh_token = self._store.company_sessions.refresh_token(session, self._keys)
        try:
            if refresh_token is None:
                raise Unauthorized("no refresh token")
            token = await self._token({"grant_type": "refresh_token",
                                       "refresh_token": refresh_token})
            user = await self._follow(await self._claims(token, nonce=None))
        except Unauthorized:
            await self._store.company_sessions.delete(session_id)
            raise Unauthorized("the company sign-in ended; sign in again") from None
        await self._store.company_sessions.save(
            session_id, user["_id"], token.get("refresh_token") or refresh_token,
            self._next_refresh(), session["expires_at"], self._keys)

    # --- the provider -----------------------------------------------------------------------

    async def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
            async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
                answer = await http.get(url)
                answer.raise_for_status()
                self._metadata = dict(answer.json())
        return self._metadata

    async def _token(self, grant: dict[str, Any]) -> dict[str, Any]:
        """The token endpoint's answer to `grant` (the client authenticates with its secret,
        client_secret_basic); Unauthorized when it refuses (a revoked or expired grant)."""
        meta = await self.metadata()
        auth = (self.settings.client_id, self.settings.client_secret.get_secret_value())
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
            answer = await http.post(meta["token_endpoint"], data=grant, auth=auth,
                                     headers={"accept": "application/json"})
        if answer.status_code != 200:
            raise Unauthorized(f"the identity provider refused ({answer.status_code}: "
                               f"{answer.text[:200]})")
        return dict(answer.json())

    async def _claims(self, token: dict[str, Any], nonce: str | None) -> dict[str, Any]:
        """The ID token's claims, checked, and the userinfo's (groups may be in either)."""
        meta = await self.metadata()
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
            keys = KeySet.import_key_set((await http.get(meta["jwks_uri"])).json())
            userinfo: dict[str, Any] = {}
            if meta.get("userinfo_endpoint") and token.get("access_token"):
                answer = await http.get(meta["userinfo_endpoint"], headers={
                    "authorization": f"Bearer {token['access_token']}"})
                userinfo = answer.json() if answer.status_code == 200 else {}
        expected = jwt.JWTClaimsRegistry(
            leeway=60, iss={"essential": True, "value": meta["issuer"]},
            aud={"essential": True, "value": self.settings.client_id},
            exp={"essential": True}, sub={"essential": True})
        try:
            claims = jwt.decode(token["id_token"], keys, algorithms=ID_TOKEN_ALGORITHMS).claims
            expected.validate(claims)
        except (JoseError, KeyError, ValueError) as exc:
            raise Unauthorized(f"the identity provider's ID token does not check: {exc}"
                               ) from exc
        if nonce is not None and not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
            raise Unauthorized("the ID token's nonce is not this sign-in's")
        if userinfo.get("sub") not in (None, claims["sub"]):
            userinfo = {}  # another person's: ignored
        return {**userinfo, **claims}

    # --- the person -------------------------------------------------------------------------

    async def _follow(self, claims: dict[str, Any]) -> dict[str, Any]:
        """The bus's user for these claims, made or updated: bus-wide role and teams follow
        the groups."""
        name = str(claims.get(self.settings.username_claim) or "").lower()
        if not re.match(USERNAME_PATTERN, name):
            raise Unauthorized(f"the identity provider's {self.settings.username_claim!r} "
                               f"({name[:64]!r}) is not a user name here")
        groups = claims.get(self.settings.groups_claim) or []
        groups = {str(g) for g in (groups if isinstance(groups, list) else [groups])}
        role = (Role.ADMIN if groups & set(self.settings.admin_groups) else Role.OPERATOR
                if groups & set(self.settings.operator_groups) else Role.VIEWER)
        user = await self._users.find_user(name)
        if user is None:
            user = await self._users.create_user(name, hash_password(new_password()), role)
        elif user.get("disabled"):
            raise Unauthorized(f"user {name} is disabled here")
        elif user["role"] != role.value:
            user = await self._users.update_user(name, role=role.value)
        await self._store.teams.follow_groups(name, self._teams_of(groups))
        return user

    def _teams_of(self, groups: set[str]) -> dict[str, TeamRole]:
        teams: dict[str, TeamRole] = {}
        for group, target in self.settings.team_map.items():
            if group not in groups:
                continue
            team, _, role_name = target.partition(":")
            role = TeamRole(role_name or TeamRole.VIEWER)
            if team not in teams or role.rank > teams[team].rank:
                teams[team] = role
        return teams

    def _next_refresh(self) -> Any:
        return utcnow() + timedelta(seconds=self.settings.refresh_s)
