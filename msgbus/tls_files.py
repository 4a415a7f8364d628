"""TLS contexts from PEM text: `ssl` loads a client certificate and key only from files, so
they are written for the moment of loading into a private directory (mode 0700, in memory at
/dev/shm where there is one) that is removed at once."""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

_IN_MEMORY = "/dev/shm"


class TlsSetupError(ValueError):
    """The certificate, key or CA bundle cannot be used (named in the message)."""


def client_context(client_cert: str | None, client_key: str | None,
                   ca_bundle: str | None) -> ssl.SSLContext:
    """A verifying client context: the system's CAs plus `ca_bundle`, presenting the client
    certificate when one is given."""
    context = ssl.create_default_context()
    if ca_bundle is not None:
        try:
            context.load_verify_locations(cadata=ca_bundle)
        except (ssl.SSLError, ValueError, TypeError) as exc:  # TypeError: not ASCII
            raise TlsSetupError(f"ca_bundle holds no usable PEM certificate: {exc}") from None
    if client_cert is not None and client_key is not None:
        _load_chain(context, client_cert, client_key)
    return context


def check_cert_and_key(client_cert: str, client_key: str) -> None:
    """A TlsSetupError unless the key is the certificate's (and both are PEM)."""
    _load_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), client_cert, client_key)


def _load_chain(context: ssl.SSLContext, cert: str, key: str) -> None:
    parent = _IN_MEMORY if os.path.isdir(_IN_MEMORY) and os.access(_IN_MEMORY, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="msgbus-tls-", dir=parent) as directory:
        cert_path, key_path = Path(directory, "cert.pem"), Path(directory, "key.pem")
        for path, text in ((cert_path, cert), (key_path, key)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
        try:
            context.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as exc:
            raise TlsSetupError("client_cert and client_key do not load as a PEM certificate "
                                f"and its unencrypted key: {exc.reason or exc}") from None
