"""The `direct` path: no MQ; the receiver hands messages to a dispatcher over an internal,
token-authenticated HTTP endpoint. Also the fallback when a broker refuses a message."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from msgbus.brokers.base import Publisher, PublishOutcome
from msgbus.codec import encode_batch
from msgbus.models import BrokerKind, Destination, Envelope, Subscription

INTERNAL_PATH = "/internal/v1/deliveries"
BATCH_CONTENT_TYPE = "application/x-msgbus-envelopes"
_STALE_CONNECTION = "dispatcher closed the connection"


class DirectPublisher(Publisher):
    kind = BrokerKind.DIRECT

    def __init__(self, dispatcher_url: str, token: str, *, timeout_s: float = 10.0) -> None:
        self._url = dispatcher_url.rstrip("/") + INTERNAL_PATH
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout)

    async def ensure_topology(
        self, destination: Destination, subscriptions: Sequence[Subscription]
    ) -> None:
        return None  # nothing to create

    async def publish(
        self, destination: Destination, envelopes: Sequence[Envelope]
    ) -> list[PublishOutcome]:
        assert self._session is not None, "DirectPublisher.start() was not called"
        data = encode_batch(list(envelopes))
        error = await self._post(data)
        if error is not None and error.startswith(_STALE_CONNECTION):
            # the dispatcher closed an idle kept-alive connection as we reused it: the
            # request never reached it, so sending again on a fresh connection is safe
            error = await self._post(data)
        return [PublishOutcome(e.message_id, error) for e in envelopes]

    async def _post(self, data: bytes) -> str | None:
        """None when the dispatcher took the batch, else why not."""
        assert self._session is not None
        try:
            async with self._session.post(
                self._url, data=data,
                headers={"authorization": f"Bearer {self._token}",
                         "content-type": BATCH_CONTENT_TYPE},
            ) as response:
                if response.status != 202:
                    detail = (await response.text())[:200]
                    return f"dispatcher answered {response.status}: {detail}"
        except aiohttp.ServerDisconnectedError as exc:
            return f"{_STALE_CONNECTION}: {exc}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return f"dispatcher unreachable: {type(exc).__name__}: {exc}"
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
