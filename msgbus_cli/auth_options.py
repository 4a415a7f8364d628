"""`msgbus subscription put`'s options for the subscription's `auth` (msgbus/push_credentials.py):
how its pushes authenticate to the subscriber, besides their signature.

No secret is an option's value, where it would stay in the shell's history and show in `ps`:
a header value, the Basic password and the OAuth2 client secret come from environment
variables (the password and the secret, when neither is given nor stored, from a prompt), the
TLS client key from a file. The current auth, as the API answers it, has its secrets masked
('********'); sent back, a mask keeps the stored value, so options change only what they name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from msgbus_cli.admin_client import F

# a part of the auth -> its options and the field each sets; "*_env" options name an
# environment variable, Path ones a file
PARTS: dict[str, dict[str, str]] = {
    "basic": {"basic_user": "username", "basic_password_env": "password"},
    "oauth2": {"oauth2_token_url": "token_url", "oauth2_client_id": "client_id",
               "oauth2_client_secret_env": "client_secret", "oauth2_scope": "scope",
               "oauth2_audience": "audience", "oauth2_resource": "resource",
               "oauth2_client_auth": "client_auth"},
    "tls": {"tls_cert": "client_cert", "tls_key": "client_key", "tls_ca": "ca_bundle"},
}
# a part's secret that, neither given nor stored, is asked for
PROMPTED = {"basic": ("password", "Basic password"),
            "oauth2": ("client_secret", "OAuth2 client secret")}
# both set the Authorization header: setting one removes the other
REPLACES = {"basic": "oauth2", "oauth2": "basic"}

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
OPTIONS = (
    click.option("--header-env", multiple=True, metavar="NAME=VAR",
                 help="Send header NAME with every push, its value read from environment "
                      "variable VAR (repeatable; the other headers stay)."),
    click.option("--drop-header", multiple=True, metavar="NAME",
                 help="Stop sending header NAME (repeatable)."),
    click.option("--basic-user", help="Basic auth: the username (replaces OAuth2)."),
    click.option("--basic-password-env", metavar="VAR",
                 help="Basic auth: the password, from environment variable VAR [default: the "
                      "stored one, else asked]."),
    click.option("--oauth2-token-url", help="OAuth2 client credentials: the token endpoint "
                                            "(replaces Basic)."),
    click.option("--oauth2-client-id"),
    click.option("--oauth2-client-secret-env", metavar="VAR",
                 help="The OAuth2 client secret, from environment variable VAR [default: the "
                      "stored one, else asked]."),
    click.option("--oauth2-scope"),
    click.option("--oauth2-audience", help="Sent as `audience` (Auth0, Okta, Keycloak)."),
    click.option("--oauth2-resource", help="Sent as `resource` (RFC 8707)."),
    click.option("--oauth2-client-auth", type=click.Choice(["basic", "body"]),
                 help="The client secret in an Authorization header (basic, the default) or "
                      "in the form body."),
    click.option("--tls-cert", type=_FILE, metavar="FILE",
                 help="TLS client certificate, PEM (then any intermediates); https only."),
    click.option("--tls-key", type=_FILE, metavar="FILE",
                 help="Its private key, PEM, unencrypted."),
    click.option("--tls-ca", type=_FILE, metavar="FILE",
                 help="CA certificates to trust besides the system's, PEM."),
    click.option("--no-auth", is_flag=True,
                 help="Start from no auth: alone, the subscription's is removed; with other "
                      "auth options, they make the whole new one (secrets given again)."),
)
NAMES = ("header_env", "drop_header", "no_auth",
         *(option for options in PARTS.values() for option in options))


def auth_options(command: F) -> F:
    """The auth options, on a command that passes them to `take_auth_options`."""
    for option in reversed(OPTIONS):
        command = option(command)
    return command


def take_auth_options(options: dict[str, Any]) -> dict[str, Any]:
    """The auth options given, taken out of a command's `options`."""
    taken = {name: options.pop(name, None) for name in NAMES}
    return {name: value for name, value in taken.items() if value not in (None, (), False)}


def changed_auth(auth: dict[str, Any] | None, given: dict[str, Any]) -> dict[str, Any] | None:
    """`auth` (as the API answers it, or None) with the options `given` applied (None: no
    auth)."""
    if all(any(option in given for option in PARTS[kind]) for kind in REPLACES):
        raise click.UsageError("Basic and OAuth2 both set the Authorization header: choose one")
    # the current parts that are set, unless --no-auth
    changed = {} if given.get("no_auth") else {k: v for k, v in (auth or {}).items() if v}
    headers = _headers(changed.pop("headers", {}), given)
    if headers:
        changed["headers"] = headers
    for kind, options in PARTS.items():
        fields = {field: _value(option, given[option]) for option, field in options.items()
                  if option in given}
        if not fields:
            continue
        part = changed[kind] = (changed.get(kind) or {}) | fields
        if kind in REPLACES:
            changed.pop(REPLACES[kind], None)
        if kind in PROMPTED:
            secret, prompt = PROMPTED[kind]
            if not part.get(secret):
                part[secret] = click.prompt(prompt, hide_input=True)
    return changed or None


def _headers(headers: dict[str, str], given: dict[str, Any]) -> dict[str, str]:
    """`headers` less those dropped, with those set (a name's case does not count)."""
    setting = [_pair(spec) for spec in given.get("header_env", ())]
    gone = {name.lower() for name in (*given.get("drop_header", ()), *(n for n, _ in setting))}
    kept = {name: value for name, value in headers.items() if name.lower() not in gone}
    return kept | {name: _from_env(var, "--header-env") for name, var in setting}


def _pair(spec: str) -> tuple[str, str]:
    name, _, var = spec.partition("=")
    if not name or not var:
        raise click.BadParameter(f"{spec!r} is not NAME=VAR", param_hint="--header-env")
    return name, var


def _value(option: str, value: Any) -> Any:
    if isinstance(value, Path):
        return value.read_text()
    if option.endswith("_env"):
        return _from_env(value, f"--{option.replace('_', '-')}")
    return value


def _from_env(var: str, option: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise click.BadParameter(f"environment variable {var} is not set or empty",
                                 param_hint=option)
    return value
