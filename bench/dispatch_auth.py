"""What the auth phase of `python -m bench.dispatch` (issue 40) needs besides the stack
(bench/dispatch_stack.py): subscriptions whose pushes authenticate, and what they authenticate
to.

- a CA of the benchmark's own (`msgbus_devtools.testkit.certs.TestCa`), its server certificate
  for 127.0.0.1 and a client certificate, written to the stack's work directory;
- two more subscriber processes (bench/dispatch_subscriber.py, the same app as "sub"), over
  https: "sub-https" (server TLS only) and "sub-mtls" (client certificates of that CA
  required);
- the OAuth2 authorization server of the tests (`node tests/tools/oauth2-server.mjs`, npm
  oidc-provider: client credentials, JWT access tokens living `ttl_s` seconds), which prints
  "issued <client_id>" per token, so the benchmark counts the dispatcher's token fetches.

The four kinds of subscription, each `auth` (msgbus/push_credentials.py):
plain (none, http), oauth2 (client credentials, the same http subscriber process as plain: the
subscriber does not check the token), https (only the CA to trust) and mtls (a client
certificate and key, and the CA). All are processes of the stack, stopped by PID with it.
"""

from __future__ import annotations

import json
import secrets
import shutil
import ssl
from dataclasses import dataclass
from pathlib import Path

from msgbus_devtools import servers as services
from msgbus_devtools.testkit.certs import Issued, ServerTls, TestCa

from bench.dispatch_stack import HOST, DispatchStack
from bench.report import say
from msgbus.push_credentials import OAuth2ClientCredentials, PushAuth, PushTls

REPO = Path(__file__).resolve().parents[1]
OAUTH2_SERVER = REPO / "tests" / "tools" / "oauth2-server.mjs"
OAUTH2_PACKAGE = REPO / "tests" / "tools" / "node_modules" / "oidc-provider"
RESOURCE = "https://subscriber.test/"
CLIENT_ID = "bench-dispatch"
AUTH_KINDS = ("plain", "oauth2", "https", "mtls")


def missing_tools() -> str | None:
    """Why the OAuth2 server cannot start here (None: it can)."""
    if shutil.which("node") is None:
        return "node is not on PATH"
    if not OAUTH2_PACKAGE.is_dir():
        return (f"{OAUTH2_PACKAGE.relative_to(REPO)} is missing (scripts/test.sh installs it: "
                "npm ci in tests/tools)")
    return None


@dataclass(frozen=True)
class AuthTargets:
    plain_url: str  # the http subscriber process ("sub") of the stack
    https_url: str
    mtls_url: str
    token_url: str
    oauth2_log: Path
    client_secret: str
    ca_pem: str
    client: Issued
    ttl_s: int

    def base_url(self, kind: str) -> str:
        return {"https": self.https_url, "mtls": self.mtls_url}.get(kind, self.plain_url)

    def auth(self, kind: str) -> PushAuth | None:
        if kind == "oauth2":
            return PushAuth(oauth2=OAuth2ClientCredentials.model_validate({
                "token_url": self.token_url, "client_id": CLIENT_ID,
                "client_secret": self.client_secret, "scope": "push", "resource": RESOURCE,
                "client_auth": "basic"}))
        if kind == "https":
            return PushAuth(tls=PushTls(ca_bundle=self.ca_pem))
        if kind == "mtls":
            return PushAuth(tls=PushTls(client_cert=self.client.cert, client_key=self.client.key,
                                        ca_bundle=self.ca_pem))
        return None

    def issued(self) -> int:
        """Tokens the OAuth2 server has issued so far (to anyone: the dispatcher alone asks)."""
        return sum(1 for line in self.oauth2_log.read_text().splitlines()
                   if line.startswith("issued "))


def start_auth_targets(stack: DispatchStack, ttl_s: int) -> AuthTargets:
    """Certificates, the https and mTLS subscribers and the OAuth2 server, on a started stack."""
    certs = stack.workdir / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca = TestCa("msgbus bench CA")
    cert_file, key_file = ca.server(HOST).write(certs, "subscriber")
    ca_file = certs / "ca.crt"
    ca_file.write_text(ca.pem)
    client = ca.client()
    # how the benchmark itself reads their arrivals: trusting the CA, with a client certificate
    reader = ssl.create_default_context(cafile=str(ca_file))
    reader.load_cert_chain(*client.write(certs, "client"))
    https_url = stack.start_subscriber("sub-https", ServerTls(cert_file, key_file), reader)
    mtls_url = stack.start_subscriber("sub-mtls", ServerTls(cert_file, key_file, ca_file),
                                      reader)
    say(f"https subscribers on {https_url} (server TLS) and {mtls_url} (mutual TLS)")

    client_secret = secrets.token_urlsafe(24)
    config = stack.workdir / "oauth2.json"
    config.write_text(json.dumps({
        "clients": [{"client_id": CLIENT_ID, "client_secret": client_secret}],
        "resource": RESOURCE, "ttl_s": ttl_s}))
    port = services.free_port()
    stack.start_process("oauth2", ["node", str(OAUTH2_SERVER), str(port), str(config)], port)
    say(f"OAuth2 server on http://{HOST}:{port} (tokens living {ttl_s} s)")
    return AuthTargets(plain_url=stack.sub_url, https_url=https_url, mtls_url=mtls_url,
                       token_url=f"http://{HOST}:{port}/token",
                       oauth2_log=stack.log_path("oauth2"), client_secret=client_secret,
                       ca_pem=ca.pem, client=client, ttl_s=ttl_s)
