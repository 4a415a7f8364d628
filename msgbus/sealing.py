"""`SecretKeys`: secrets the bus must use again (subscriptions' signing secrets, teams' notify
secrets) are stored encrypted ("sealed"), so that a copy of the database forges no push.

A sealed value is `mbsealed:<key id>:<Fernet token>` (AES-128-CBC with HMAC-SHA256, from the
`cryptography` package): the key id says which key opens it, so keys rotate: the newest key
seals, every key listed still opens, and `msgbus secrets rotate-key` seals every stored value
again under the newest before an old key is dropped. Keys come from `MSGBUS_SECRET_KEYS`
(`id:key,id:key`, the newest first) or a file (`MSGBUS_SECRET_KEY_FILE`, the same text);
`msgbus up` makes and keeps one in its state directory; `msgbus secrets new-key` prints one.

A value is opened only where it is used (a push's signature, a notification's, an admin's
reveal); models and documents carry it sealed. A value stored before 0.2, plain, opens as itself
until the admin seals it at start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

PREFIX = "mbsealed:"
KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
OPENED_KEPT = 10_000  # opened values kept (a few per subscription): a push opens no token


class SecretKeyError(ValueError):
    """The keys are missing or malformed, or a sealed value names a key that is not given."""


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def key_id_of(value: str) -> str | None:
    """The id of the key that sealed `value`; None for a plain one."""
    return value[len(PREFIX):].split(":", 1)[0] if is_sealed(value) else None


@dataclass
class SecretKeys:
    keys: dict[str, Fernet]  # by id; the first seals
    _opened: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def current(self) -> str:
        return next(iter(self.keys))

    @classmethod
    def parse(cls, text: str) -> SecretKeys:
        keys: dict[str, Fernet] = {}
        for item in (part.strip() for part in text.replace("\n", ",").split(",")):
            if not item or item.startswith("#"):
                continue
            key_id, sep, key = item.partition(":")
            if not sep or not KEY_ID.match(key_id):
                raise SecretKeyError("a secret key is written id:key (the id: letters, digits, "
                                     f"'_', '.', '-'), not {key_id[:32]!r}")
            try:
                keys[key_id] = Fernet(key.encode())
            except ValueError:
                raise SecretKeyError(f"secret key {key_id!r} is not a Fernet key (32 bytes, "
                                     "url-safe base64: `msgbus secrets new-key`)") from None
        if not keys:
            raise SecretKeyError("no secret key given")
        return cls(keys)

    def seal(self, plain: str) -> str:
        """`plain` encrypted with the newest key (a sealed value is left as it is)."""
        if is_sealed(plain):
            return plain
        token = self.keys[self.current].encrypt(plain.encode()).decode()
        return f"{PREFIX}{self.current}:{token}"

    def open(self, value: str) -> str:
        """The plain value (a plain one as it is)."""
        if not is_sealed(value):
            return value
        if (opened := self._opened.get(value)) is not None:
            return opened
        key_id, _, token = value[len(PREFIX):].partition(":")
        key = self.keys.get(key_id)
        if key is None:
            raise SecretKeyError(f"a secret is sealed with key {key_id!r}, which is not among "
                                 f"the keys given ({', '.join(self.keys)})")
        try:
            opened = key.decrypt(token.encode()).decode()
        except InvalidToken:
            raise SecretKeyError(f"a secret sealed with key {key_id!r} does not open with it "
                                 "(altered, or another key of that id)") from None
        if len(self._opened) >= OPENED_KEPT:
            self._opened.clear()
        self._opened[value] = opened
        return opened

    def reseal(self, value: str) -> str:
        """`value` sealed with the newest key: unchanged if it is already."""
        return value if key_id_of(value) == self.current else self.seal(self.open(value))


def new_key(key_id: str) -> str:
    """A new key as `MSGBUS_SECRET_KEYS` takes it."""
    return f"{key_id}:{Fernet.generate_key().decode()}"


def keys_from(text: str, file: str | Path | None) -> SecretKeys | None:
    """The keys of `text` (MSGBUS_SECRET_KEYS) or else of `file`; None when neither is set."""
    if text.strip():
        return SecretKeys.parse(text)
    if file:
        path = Path(file)
        try:
            return SecretKeys.parse(path.read_text())
        except OSError as exc:
            raise SecretKeyError(f"cannot read the secret key file {path}: {exc}") from None
    return None

