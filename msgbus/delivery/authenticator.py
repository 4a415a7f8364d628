"""`PushAuthenticator`: what a subscription's `auth` (msgbus/push_credentials.py) adds to its
pushes: headers (static ones, Basic, an OAuth2 Bearer token) and a TLS context (client
certificate, extra CA). One per push client, so a process's pushes share its tokens and
contexts.

OAuth2 client credentials: a token is fetched once per credentials and process, kept until
shortly before it expires, and fetched again once when a push is answered 401 (`rejected`):
concurrent pushes that were refused with the same token share one new fetch, and a token just
fetched is not dropped again (a subscriber that refuses every token costs one fetch per
`REFETCH_MIN_AGE_S`, not one per push). The token endpoint is under the egress policy too.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote_plus

import aiohttp

from msgbus import metrics
from msgbus.delivery.proxy import PushProxy
from msgbus.delivery.resolver import PolicyResolver, checked_before_proxy
from msgbus.egress import EgressPolicy, EgressRefused
from msgbus.push_credentials import OAuth2ClientCredentials, PushAuth, PushTls
from msgbus.tls_files import TlsSetupError, client_context

RENEW_RETRY_S = 1.0  # a background renewal that failed is tried again after this
REFETCH_MIN_AGE_S = 1.0  # a token younger than this that is refused is not the problem
DEFAULT_TOKEN_LIFETIME_S = 3600.0  # a token answer without expires_in
TOKEN_TIMEOUT_S = 10.0
ERROR_DETAIL_CHARS = 200
KEPT = 10_000  # memoised entries, by credentials (cleared past this)
T = TypeVar("T")


class PushAuthError(Exception):
    """The push's authentication step failed (token endpoint, certificate): a failed attempt,
    retried like any other."""


class _PerObject(Generic[T]):
    """A value worked out once per settings object (the registry keeps a subscription's objects
    until its settings change), by identity; cleared past KEPT entries."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[object, T]] = {}

    def get(self, settings: object, make: Callable[[], T]) -> T:
        known = self._known.get(id(settings))
        if known is not None and known[0] is settings:
            return known[1]
        value = make()
        if len(self._known) >= KEPT:
            self._known.clear()
        self._known[id(settings)] = (settings, value)
        return value


@dataclass(slots=True)
class _Token:
    value: str
    fetched_at: float  # time.monotonic()
    renew_at: float  # from then a new one is fetched in the background, this one still used
    use_until: float  # from then pushes wait for the new one


class PushAuthenticator:
    def __init__(self, open_secret: Callable[[str], str], egress: EgressPolicy,
                 user_agent: str, proxy: PushProxy | None = None) -> None:
        self._open = open_secret
        self._egress = egress
        self._proxy = proxy
        self._user_agent = user_agent
        self._headers: _PerObject[dict[str, str]] = _PerObject()  # by auth
        self._contexts: dict[tuple[str | None, str | None, str | None], ssl.SSLContext] = {}
        self._tokens: dict[str, _Token] = {}
        self._token_keys: _PerObject[str] = _PerObject()  # by oauth2
        self._fetching: dict[str, asyncio.Future[_Token]] = {}
        self._failed_at: dict[str, float] = {}  # the last failed fetch, by credentials
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def headers(self, auth: PushAuth) -> dict[str, str]:
        """The headers `auth` adds to a push; fetches a token when none is kept."""
        fixed = self._fixed_headers(auth)
        if auth.oauth2 is None:
            return fixed
        token = await self._token(auth.oauth2, auth.tls)
        return fixed | {"authorization": f"Bearer {token.value}"}

    def tls(self, auth: PushAuth) -> ssl.SSLContext | None:
        """The TLS context of `auth` (None: the default one); one per certificate, key and CA."""
        return None if auth.tls is None else self._tls_context(auth.tls)

    def _tls_context(self, tls: PushTls) -> ssl.SSLContext:
        key = (tls.client_cert, tls.client_key, tls.ca_bundle)  # the key as stored: sealed
        context = self._contexts.get(key)
        if context is None:
            if len(self._contexts) >= KEPT:
                self._contexts.clear()
            context = self._contexts[key] = self._context_of(tls)
        return context

    def rejected(self, auth: PushAuth, sent: dict[str, str]) -> bool:
        """A push with headers `sent` was answered 401: whether to push once more (with a new
        token, or with the one another push has fetched meanwhile)."""
        if auth.oauth2 is None:
            return False
        key = self._token_key(auth.oauth2)
        token = self._tokens.get(key)
        if token is None or f"Bearer {token.value}" != sent.get("authorization"):
            return True  # renewed or being renewed already: push with the new one
        if time.monotonic() - token.fetched_at < REFETCH_MIN_AGE_S:
            return False
        del self._tokens[key]
        return True

    # --- internals -------------------------------------------------------------------------

    def _fixed_headers(self, auth: PushAuth) -> dict[str, str]:
        return self._headers.get(auth, functools.partial(self._opened_headers, auth))

    def _opened_headers(self, auth: PushAuth) -> dict[str, str]:
        fixed = {name: self._open(value) for name, value in auth.headers.items()}
        if auth.basic is not None:
            fixed["authorization"] = _basic(auth.basic.username, self._open(auth.basic.password))
        return fixed

    def _token_key(self, oauth: OAuth2ClientCredentials) -> str:
        """Every field (a changed secret or scope is another token), worked out once per
        settings object."""
        return self._token_keys.get(oauth, oauth.model_dump_json)

    def _context_of(self, tls: PushTls) -> ssl.SSLContext:
        try:
            key = self._open(tls.client_key) if tls.client_key is not None else None
            return client_context(tls.client_cert, key, tls.ca_bundle)
        except TlsSetupError as exc:
            raise PushAuthError(f"auth.tls: {exc}") from None

    async def _token(self, oauth: OAuth2ClientCredentials, tls: PushTls | None) -> _Token:
        key = self._token_key(oauth)
        token = self._tokens.get(key)
        now = time.monotonic()
        if token is not None and now < token.renew_at:
            return token
        if token is not None and now < token.use_until:
            # renewed in the background: no push waits while the token still holds
            if now - self._failed_at.get(key, 0.0) >= RENEW_RETRY_S:
                self._fetch_once(key, oauth, tls)
            return token
        return await asyncio.shield(self._fetch_once(key, oauth, tls))

    def _fetch_once(self, key: str, oauth: OAuth2ClientCredentials,
                    tls: PushTls | None) -> asyncio.Future[_Token]:
        """The fetch of `key`'s token under way, or a new one: one at a time per credentials,
        every push that needs it waits for the same; its token is kept."""
        pending = self._fetching.get(key)
        if pending is None:
            pending = self._fetching[key] = asyncio.ensure_future(self._fetch(oauth, tls))
            pending.add_done_callback(functools.partial(self._fetched_token, key))
        return pending

    def _fetched_token(self, key: str, done: asyncio.Future[_Token]) -> None:
        self._fetching.pop(key, None)
        if done.cancelled():
            return
        if done.exception() is not None:
            self._failed_at[key] = time.monotonic()
            return
        if len(self._tokens) >= KEPT:
            self._tokens.clear()
        self._tokens[key] = done.result()

    async def _fetch(self, oauth: OAuth2ClientCredentials, tls: PushTls | None) -> _Token:
        url = str(oauth.token_url)
        form = {"grant_type": "client_credentials"}
        headers = {"accept": "application/json", "user-agent": self._user_agent}
        secret = self._open(oauth.client_secret)
        if oauth.client_auth == "basic":
            headers["authorization"] = _basic(_form_encoded(oauth.client_id),
                                              _form_encoded(secret))
        else:
            form |= {"client_id": oauth.client_id, "client_secret": secret}
        for name in ("scope", "audience", "resource"):
            if (value := getattr(oauth, name)) is not None:
                form[name] = str(value)
        proxy = self._proxy.for_url(url) if self._proxy is not None else None
        host = oauth.token_url.host or ""
        try:
            token = await self._fetched(url, form, headers, tls, proxy)
        except PushAuthError:
            metrics.PUSH_TOKEN_FETCHES.labels(host, "failed").inc()
            raise
        metrics.PUSH_TOKEN_FETCHES.labels(host, "ok").inc()
        return token

    async def _fetched(self, url: str, form: dict[str, str], headers: dict[str, str],
                       tls: PushTls | None, proxy: str | None) -> _Token:
        started = time.monotonic()
        try:
            await checked_before_proxy(self._egress, url, proxy)
            async with self._client().post(
                    url, data=form, headers=headers, allow_redirects=False, proxy=proxy,
                    ssl=self._tls_context(tls) if tls is not None else True,
                    timeout=aiohttp.ClientTimeout(total=TOKEN_TIMEOUT_S)) as response:
                answer = await _json_or_none(response)
                status = response.status
        except EgressRefused as exc:
            raise PushAuthError(f"OAuth2 token endpoint {url}: {exc}") from None
        except aiohttp.ClientConnectorError as exc:
            cause = exc.os_error if isinstance(exc.os_error, EgressRefused) else exc
            raise PushAuthError(f"OAuth2 token endpoint {url}: {cause}") from None
        except TimeoutError:
            raise PushAuthError(f"OAuth2 token endpoint {url}: no answer within "
                                f"{TOKEN_TIMEOUT_S:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise PushAuthError(f"OAuth2 token endpoint {url}: {type(exc).__name__}: "
                                f"{exc}") from None
        return _token_of(url, status, answer, started)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(resolver=PolicyResolver(self._egress, self._proxy),
                                             keepalive_timeout=4.0)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session


def _basic(username: str, password: str) -> str:
    """An RFC 7617 Basic authorization header's value."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _form_encoded(value: str) -> str:
    """RFC 6749 §2.3.1: the client id and secret are form-encoded before Basic."""
    return quote_plus(value)


async def _json_or_none(response: aiohttp.ClientResponse) -> Any:
    text = (await response.content.read(64 * 1024)).decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text[:ERROR_DETAIL_CHARS]


def _token_of(url: str, status: int, answer: Any, started: float) -> _Token:
    if status != 200 or not isinstance(answer, dict):
        detail = ({k: answer[k] for k in ("error", "error_description") if k in answer}
                  if isinstance(answer, dict) else answer)
        raise PushAuthError(f"OAuth2 token endpoint {url}: HTTP {status}: "
                            f"{str(detail)[:ERROR_DETAIL_CHARS]}")
    value = answer.get("access_token")
    kind = str(answer.get("token_type", "bearer")).lower()
    if not isinstance(value, str) or not value or kind != "bearer":
        raise PushAuthError(f"OAuth2 token endpoint {url}: the answer holds no Bearer "
                            "access_token")
    lifetime = answer.get("expires_in")
    if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
        lifetime = DEFAULT_TOKEN_LIFETIME_S
    # renewed before it expires: a tenth of its life early (at most a minute), and a second
    # more for issuers that count in whole seconds (a "4 s" token may have 3.0 s left), but
    # used for half its life at least; used while the new one comes, until a second (a
    # quarter of its life, if shorter) before it expires
    early = min(60.0, lifetime / 10 + 1.0, lifetime / 2)
    return _Token(value, started, started + lifetime - early,
                  started + lifetime - min(1.0, lifetime / 4))
