"""msgbus producer client: durable send() through a local LMDB spool, and push verification.

from msgbus_client import MsgbusClient

with MsgbusClient("http://receiver:8000", api_key, spool_dir="/var/lib/app/msgbus") as bus:
    message_id = bus.send("orders", {"order_id": 42}, biz_id="order-42")
"""

from __future__ import annotations

from msgbus_client._version import __version__
from msgbus_client.aio import AsyncMsgbusClient
from msgbus_client.client import MsgbusClient
from msgbus_client.errors import (
    ClientClosedError,
    InvalidMessageError,
    MsgbusClientError,
    SchemaValidationError,
    SpoolDiskFullError,
    SpoolError,
    SpoolFormatError,
    SpoolFullError,
    SpoolLockedError,
    SpoolNotIdleError,
    WebhookVerificationError,
)
from msgbus_client.ids import uuid7
from msgbus_client.settings import ClientSettings
from msgbus_client.spool import RejectedMessage, Spool, SpoolStats
from msgbus_client.verify import sign_push, verify_push

__all__ = [
    "AsyncMsgbusClient",
    "ClientClosedError",
    "ClientSettings",
    "InvalidMessageError",
    "MsgbusClient",
    "MsgbusClientError",
    "RejectedMessage",
    "SchemaValidationError",
    "Spool",
    "SpoolDiskFullError",
    "SpoolError",
    "SpoolFormatError",
    "SpoolFullError",
    "SpoolLockedError",
    "SpoolNotIdleError",
    "SpoolStats",
    "WebhookVerificationError",
    "__version__",
    "sign_push",
    "uuid7",
    "verify_push",
]
