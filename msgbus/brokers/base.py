"""What every broker adapter provides, and how bus objects are named on a broker.

A `Publisher` is used by the receiver; a `SubscriptionConsumer` (one per subscription) by the
dispatcher. Both are asyncio-facing; adapters built on blocking client libraries run those in
their own threads and never block the event loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from msgbus.models import DEFAULT_CLUSTER, BrokerKind, Destination, Envelope, Subscription


def topic_name(destination: str) -> str:
    """Kafka topic / RabbitMQ exchange of a destination."""
    return f"msgbus.{destination}"


def consumer_name(destination: str, subscription: str) -> str:
    """Kafka consumer group / RabbitMQ queue of a subscription."""
    return f"{topic_name(destination)}.{subscription}"


@dataclass(slots=True)
class PublishOutcome:
    """Per-message result of a publish: `error` is None when the broker confirmed it."""

    message_id: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Publisher(ABC):
    kind: BrokerKind
    cluster: str = DEFAULT_CLUSTER  # which of the configured clusters of `kind` it publishes to

    @abstractmethod
    async def start(self) -> None:
        """Connect. Raises BrokerError when the broker cannot be reached."""

    @abstractmethod
    async def ensure_topology(
        self, destination: Destination, subscriptions: Sequence[Subscription]
    ) -> None:
        """Create (idempotently) the topic/exchange and per-subscription queues/bindings."""

    @abstractmethod
    async def publish(
        self, destination: Destination, envelopes: Sequence[Envelope]
    ) -> list[PublishOutcome]:
        """Publish and wait for the broker's acknowledgement of each message.

        Never raises for a per-message refusal: that message's outcome carries the error, and
        the caller sends it down the direct path.
        """

    @abstractmethod
    async def close(self) -> None: ...


@dataclass(slots=True)
class Received:
    """A message taken from a subscription's stream; `token` is the adapter's ack handle."""

    envelope: Envelope
    token: Any


class SubscriptionConsumer(ABC):
    """The stream of one subscription (Kafka consumer group / RabbitMQ queue)."""

    kind: BrokerKind

    def __init__(self, subscription: Subscription, *, max_buffered: int) -> None:
        self.subscription = subscription
        # what the dispatcher asked this consumer for: its kind, on one cluster or all (None)
        self.source: tuple[BrokerKind, str | None] = (self.kind, None)
        self.max_buffered = max_buffered
        self.paused_partitions = 0  # Kafka: partitions paused because max_buffered is reached

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def receive(self, max_messages: int, timeout_s: float) -> list[Received]:
        """Up to `max_messages`, waiting at most `timeout_s` for the first one."""

    @abstractmethod
    def ack(self, received: Received) -> None:
        """The message is done with (its outcome is recorded); the broker may forget it.

        Kafka commits offsets only up to the lowest message still in flight.
        """

    @abstractmethod
    async def close(self) -> None: ...
