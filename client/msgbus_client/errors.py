"""Errors raised by msgbus_client.

Tree::

    MsgbusClientError
    ├── InvalidMessageError        (also a TypeError and a ValueError) bad input to send()
    ├── ClientClosedError          send() after close()
    ├── SpoolError                 the local LMDB spool cannot be used
    │   ├── SpoolLockedError       another process (or client) owns the spool dir
    │   ├── SpoolFullError         max_spool_bytes reached; nothing was written
    │   └── SpoolFormatError       the dir holds a spool this version cannot read
    └── WebhookVerificationError   verify_push(): the push is not authentic or too old

Network failures never surface as exceptions from send(): a spooled message stays in the spool
until the resender delivers it.
"""

from __future__ import annotations


class MsgbusClientError(Exception):
    """Base of every error this library raises on purpose."""


class InvalidMessageError(MsgbusClientError, TypeError, ValueError):
    """send() got something it cannot encode; nothing was spooled.

    It is both a TypeError and a ValueError so that callers may catch whichever feels natural.
    """


class ClientClosedError(MsgbusClientError):
    """The client was closed; create a new one to send again."""


class SpoolError(MsgbusClientError):
    """The local spool cannot be used."""


class SpoolLockedError(SpoolError):
    """Another process (or another client in this process) already owns this spool dir."""


class SpoolFullError(SpoolError):
    """The spool reached max_spool_bytes; the message was not written and not sent."""


class SpoolFormatError(SpoolError):
    """The spool dir was written by an incompatible version of msgbus_client."""


class WebhookVerificationError(MsgbusClientError):
    """A push failed signature or timestamp verification; do not process it."""
