"""`make_sender`: the push client a setting names (`MSGBUS_DISPATCHER_HTTP_CLIENT`)."""

from __future__ import annotations

from msgbus.delivery.aiohttp_sender import AiohttpSender
from msgbus.delivery.h1_sender import H1Sender
from msgbus.delivery.sender import SENDER_KINDS, Sender


def make_sender(kind: str, *, instance: str, max_connections: int = 1000) -> Sender:
    """The sender named by `kind` ("h1", the default, or "aiohttp"), not started yet."""
    if kind == "h1":
        return H1Sender(instance=instance, max_connections=max_connections)
    if kind == "aiohttp":
        return AiohttpSender(instance=instance, max_connections=max_connections)
    raise ValueError(f"unknown HTTP client {kind!r}; choose from {', '.join(SENDER_KINDS)}")
