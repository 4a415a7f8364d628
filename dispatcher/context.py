"""`PushContext`: what every part of a subscription's worker (pushers, ordered lanes, delayed
messages, the batch collector) pushes with; the worker builds one and hands it to each."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.sender import Sender
from msgbus.models import Subscription

Track = Callable[[Coroutine[Any, Any, None]], None]  # runs a task the worker's close waits for


@dataclass(frozen=True)
class PushContext:
    subscription: Subscription
    limiter: SubscriptionLimiter  # its circuit, and this process's share of its cap and rate
    sender: Sender
    track: Track
    closing: asyncio.Event  # set when the worker closes: waits in place end at once
