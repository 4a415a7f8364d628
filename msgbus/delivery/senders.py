"""`make_sender`: the push client a setting names (`MSGBUS_DISPATCHER_HTTP_CLIENT`)."""

from __future__ import annotations

from msgbus.delivery.aiohttp_sender import AiohttpSender
from msgbus.delivery.h1_sender import H1Sender
from msgbus.delivery.sender import SENDER_KINDS, Sender
from msgbus.sealing import SecretKeys
from msgbus.settings import PushSettings


def make_sender(kind: str, *, instance: str, push: PushSettings,
                max_connections: int = 1000, keys: SecretKeys | None = None) -> Sender:
    """The sender named by `kind` ("h1", the default, or "aiohttp"), not started yet. `push`:
    what every push client shares (MSGBUS_PUSH_*), built at the entry point with the settings
    of the service that pushes (their `push`); `keys` open the sealed signing secrets. Through
    a proxy (MSGBUS_PUSH_PROXY) the aiohttp client pushes, whichever is named."""
    proxy = push.push_proxy()
    if proxy is not None and kind in SENDER_KINDS:
        return AiohttpSender(instance=instance, max_connections=max_connections,
                             answer_keep_bytes=push.answer_keep_bytes,
                             egress=push.egress_policy(), keys=keys, proxy=proxy)
    if kind == "h1":
        return H1Sender(instance=instance, max_connections=max_connections,
                        answer_keep_bytes=push.answer_keep_bytes, egress=push.egress_policy(),
                        keys=keys)
    if kind == "aiohttp":
        return AiohttpSender(instance=instance, max_connections=max_connections,
                             answer_keep_bytes=push.answer_keep_bytes,
                             egress=push.egress_policy(), keys=keys)
    raise ValueError(f"unknown HTTP client {kind!r}; choose from {', '.join(SENDER_KINDS)}")
