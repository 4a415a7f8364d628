"""`make_sender`: the push client a setting names (`MSGBUS_DISPATCHER_HTTP_CLIENT`)."""

from __future__ import annotations

from msgbus.delivery.aiohttp_sender import AiohttpSender
from msgbus.delivery.h1_sender import H1Sender
from msgbus.delivery.sender import SENDER_KINDS, Sender
from msgbus.settings import PushSettings


def make_sender(kind: str, *, instance: str, max_connections: int = 1000,
                answer_keep_bytes: int | None = None) -> Sender:
    """The sender named by `kind` ("h1", the default, or "aiohttp"), not started yet.
    `answer_keep_bytes`: default MSGBUS_PUSH_ANSWER_KEEP_BYTES."""
    keep = PushSettings().answer_keep_bytes if answer_keep_bytes is None else answer_keep_bytes
    if kind == "h1":
        return H1Sender(instance=instance, max_connections=max_connections,
                        answer_keep_bytes=keep)
    if kind == "aiohttp":
        return AiohttpSender(instance=instance, max_connections=max_connections,
                             answer_keep_bytes=keep)
    raise ValueError(f"unknown HTTP client {kind!r}; choose from {', '.join(SENDER_KINDS)}")
