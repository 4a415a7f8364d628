"""`PushAuth`: how a subscription's pushes authenticate to its subscriber, beside the signature
every push carries: static headers, Basic, OAuth2 client credentials, and TLS (a client
certificate, and CA certificates to trust for a private CA).

Secret values (header values, the Basic password, the OAuth2 client secret, the TLS key) are
stored sealed (msgbus/sealing.py) and opened only by the push clients
(msgbus/delivery/authenticator.py). Answers show them as `MASK`; a `MASK` sent back in a PUT
keeps the stored value, so a form can be saved without retyping every secret.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, HttpUrl, model_validator

from msgbus.sealing import is_sealed
from msgbus.tls_files import check_cert_and_key, client_context

MASK = "********"
MAX_SECRET_CHARS = 16_384  # a plain value; sealed, it is about 4/3 longer
MAX_PEM_CHARS = 65_536

HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")  # an HTTP token (RFC 9110)
# headers every push sets itself, or that would change how the request is read
RESERVED_HEADERS = frozenset({
    "host", "content-length", "content-type", "transfer-encoding", "connection", "te",
    "upgrade", "user-agent", "traceparent", "tracestate", "expect", "keep-alive",
    "proxy-authorization", "trailer"})
RESERVED_PREFIXES = ("webhook-", "ce-", "x-msgbus-")


def _secret_checked(value: str) -> str:
    """A plain secret: its length and no line break. A sealed one (as stored) or the mask (a
    PUT keeping the stored value) passes as it is."""
    if is_sealed(value) or value == MASK:
        return value
    if len(value) > MAX_SECRET_CHARS:
        raise ValueError(f"a secret value has at most {MAX_SECRET_CHARS} characters")
    if "\r" in value or "\n" in value or "\0" in value:
        raise ValueError("a secret value holds no line break or NUL")
    return value


SecretValue = Annotated[str, Field(min_length=1, max_length=4 * MAX_SECRET_CHARS),
                        AfterValidator(_secret_checked)]
PemSecret = Annotated[str, Field(min_length=1, max_length=4 * MAX_PEM_CHARS)]
Pem = Annotated[str, Field(min_length=1, max_length=MAX_PEM_CHARS)]
Token = Annotated[str, Field(min_length=1, max_length=1000, pattern=r"^[\x21-\x7e]+$")]
Words = Annotated[str, Field(min_length=1, max_length=1000, pattern=r"^[\x20-\x7e]+$")]


class _Model(BaseModel):
    # no numbers here; what ConfigModel adds is not needed, and it lives in msgbus.models
    model_config = ConfigDict(extra="forbid")


class BasicAuth(_Model):
    username: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^:\r\n\x00]+$")]
    password: SecretValue


class OAuth2ClientCredentials(_Model):
    """RFC 6749 §4.4: the token is fetched from `token_url` and sent as a Bearer token."""

    token_url: HttpUrl
    client_id: Token
    client_secret: SecretValue
    scope: Words | None = None
    audience: Token | None = Field(default=None, description="sent as `audience` (Auth0, "
                                                             "Okta, Keycloak)")
    resource: HttpUrl | None = Field(default=None, description="sent as `resource` (RFC 8707)")
    client_auth: Literal["basic", "body"] = Field(
        default="basic", description="client_secret_basic (an Authorization header) or "
                                     "client_secret_post (in the form body)")


class PushTls(_Model):
    """A client certificate for mutual TLS, and CA certificates to trust besides the system's
    (for a subscriber whose certificate a private CA signed); either or both."""

    client_cert: Pem | None = Field(default=None, description="PEM: the certificate, then any "
                                                              "intermediates")
    client_key: PemSecret | None = Field(default=None, description="PEM, unencrypted; secret")
    ca_bundle: Pem | None = Field(default=None, description="PEM certificates to trust")

    @model_validator(mode="after")
    def _usable(self) -> PushTls:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together")
        if self.client_cert is None and self.ca_bundle is None:
            raise ValueError("give a client certificate and key, a CA bundle, or both")
        if self.ca_bundle is not None:
            _check_ca_bundle(self.ca_bundle)
        if self.client_key is not None and not is_sealed(self.client_key) \
                and self.client_key != MASK:
            check_cert_and_key(self.client_cert or "", self.client_key)
        return self


class PushAuth(_Model):
    headers: dict[str, SecretValue] = Field(
        default_factory=dict, max_length=20,
        description="sent with every push; values are secret")
    basic: BasicAuth | None = None
    oauth2: OAuth2ClientCredentials | None = None
    tls: PushTls | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PushAuth:
        if self.basic is not None and self.oauth2 is not None:
            raise ValueError("basic and oauth2 both set the Authorization header: choose one")
        for name in self.headers:
            _check_header_name(name, authorization_free=self.basic is None
                               and self.oauth2 is None)
        return self

    @property
    def empty(self) -> bool:
        return not self.headers and self.basic is None and self.oauth2 is None \
            and self.tls is None

    def with_secrets(self, change: Callable[[str], str]) -> PushAuth:
        """A copy with `change` applied to every secret value (seal, open, mask)."""
        return self._mapped(lambda _, value: change(value))

    def secret_places(self) -> dict[str, str]:
        """Every secret value by its place ("headers.X-Api-Key", "basic.password", ...)."""
        found: dict[str, str] = {}

        def note(place: str, value: str) -> str:
            found[place] = value
            return value

        self._mapped(note)
        return found

    def masked(self) -> PushAuth:
        return self.with_secrets(lambda _: MASK)

    def keeping(self, stored: PushAuth | None) -> PushAuth:
        """This one with each `MASK` replaced by `stored`'s value at the same place; a `MASK`
        where nothing is stored is a ValueError naming the place."""
        kept = stored.secret_places() if stored is not None else {}

        def stored_at(place: str, value: str) -> str:
            if value != MASK:
                return value
            if place not in kept:
                raise ValueError(f"auth.{place} is {MASK!r}, which keeps the stored value, "
                                 "and none is stored there: give the value")
            return kept[place]

        return self._mapped(stored_at)

    def _mapped(self, change: Callable[[str, str], str]) -> PushAuth:
        update: dict[str, object] = {
            "headers": {k: change(f"headers.{k}", v) for k, v in self.headers.items()}}
        if self.basic is not None:
            update["basic"] = self.basic.model_copy(
                update={"password": change("basic.password", self.basic.password)})
        if self.oauth2 is not None:
            update["oauth2"] = self.oauth2.model_copy(update={
                "client_secret": change("oauth2.client_secret", self.oauth2.client_secret)})
        if self.tls is not None and self.tls.client_key is not None:
            update["tls"] = self.tls.model_copy(
                update={"client_key": change("tls.client_key", self.tls.client_key)})
        return self.model_copy(update=update)


@functools.lru_cache(maxsize=1024)
def _check_ca_bundle(pem: str) -> None:
    """Cached: every load of the configuration validates its subscriptions again."""
    client_context(None, None, pem)


def _check_header_name(name: str, *, authorization_free: bool) -> None:
    if not HEADER_NAME.match(name):
        raise ValueError(f"header name {name[:100]!r} is not an HTTP token (letters, digits "
                         "and !#$%&'*+.^_`|~-)")
    lower = name.lower()
    if lower in RESERVED_HEADERS or lower.startswith(RESERVED_PREFIXES):
        raise ValueError(f"header {name!r} is set by the bus itself; it cannot be configured")
    if lower == "authorization" and not authorization_free:
        raise ValueError("header 'authorization' is set by basic or oauth2 here: drop one")
