"""Request bodies of the management API."""

from __future__ import annotations

from pydantic import BaseModel, Field, HttpUrl

from msgbus.models import NAME_PATTERN, BrokerKind, RetryPolicy


class DestinationIn(BaseModel):
    broker: BrokerKind = BrokerKind.DIRECT
    description: str = ""
    partitions: int = Field(default=4, ge=1, le=256)


class SubscriptionIn(BaseModel):
    url: HttpUrl
    max_concurrency: int = Field(default=16, ge=1, le=1024)
    timeout_ms: int = Field(default=5000, ge=10, le=300_000)
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)
    paused: bool = False


class AppIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN)
    destinations: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
