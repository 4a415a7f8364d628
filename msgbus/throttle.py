"""Failed sign-ins slow down whoever fails, then lock them out for a while; the right
credentials are never slowed by someone else's failures for long.

Failures are counted per key (a user at an address, an address, a user), each kind with its
`Policy`: the first `free` failures are answered at once; each further one waits twice as long
as the one before (from 0.25 s, up to `slow_max_s`) before its 401; from `lock_after` failures
on, the key is locked: every request is answered 429 with Retry-After, without looking at its
credentials (so guessing learns nothing), for `lock_first_s`, twice as long after each further
failure, up to `lock_max_s`. Failures older than `window_s` are forgotten, and a success clears
the user's own counts.

Why no lock per user: anyone could then keep a user out for good by failing as them. A user is
only slowed, at most `slow_max_s` a try; a user at one address and an address are locked. An
admin sees who is locked (`locked()`).

The counts live in a `FailureStore`: MongoDB for the admin (shared by its replicas,
msgbus/store/signins.py), memory for the receiver (`MemoryFailures`, per process: it guards
against load from wrong API keys, which are 256-bit random and not guessed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from msgbus.errors import MsgbusError

SLOW_FIRST_S = 0.25


class TooManyAttempts(MsgbusError):
    status_code = 429
    code = "too_many_attempts"


@dataclass(frozen=True, slots=True)
class Policy:
    free: int
    slow_max_s: float
    lock_after: int | None  # None: slowed, never locked
    lock_first_s: float = 30.0
    lock_max_s: float = 900.0
    window_s: float = 900.0


@dataclass(slots=True)
class Failures:
    count: int
    last: float  # epoch seconds of the latest failure
    locked_until: float = 0.0


class FailureStore(Protocol):
    async def read(self, keys: list[str]) -> dict[str, Failures]: ...

    async def add(self, key: str, now: float, window_s: float) -> Failures:
        """One more failure of `key` (its count starts again after `window_s` without one)."""

    async def lock(self, key: str, until: float) -> None: ...

    async def clear(self, keys: list[str]) -> None: ...

    async def locked(self, now: float) -> dict[str, Failures]: ...


class MemoryFailures:
    """A `FailureStore` in this process's memory, bounded: the oldest keys go first."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self._failures: dict[str, Failures] = {}
        self._max_keys = max_keys

    async def read(self, keys: list[str]) -> dict[str, Failures]:
        return {k: f for k in keys if (f := self._failures.get(k)) is not None}

    async def add(self, key: str, now: float, window_s: float) -> Failures:
        found = self._failures.pop(key, None)
        if found is None or now - found.last > window_s:
            found = Failures(count=0, last=now, locked_until=found.locked_until if found else 0)
        found.count += 1
        found.last = now
        self._failures[key] = found  # the newest last: insertion order is age
        while len(self._failures) > self._max_keys:
            del self._failures[next(iter(self._failures))]
        return found

    async def lock(self, key: str, until: float) -> None:
        if key in self._failures:
            self._failures[key].locked_until = until

    async def clear(self, keys: list[str]) -> None:
        for key in keys:
            self._failures.pop(key, None)

    async def locked(self, now: float) -> dict[str, Failures]:
        return {k: f for k, f in self._failures.items() if f.locked_until > now}


class Throttle:
    """`check` before looking at credentials, `failed` after wrong ones (returns how long to
    wait before answering), `succeeded` after right ones. Keys are named by kind, each kind
    with its policy: e.g. {"user-address": "ana|10.0.0.7", "address": "10.0.0.7"}."""

    def __init__(self, store: FailureStore, policies: Mapping[str, Policy],
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._policies = dict(policies)
        self._clock = clock

    async def check(self, keys: Mapping[str, str]) -> None:
        """TooManyAttempts (429) while any of the keys is locked."""
        now = self._clock()
        found = await self._store.read(self._names(keys))
        until = max((f.locked_until for f in found.values()), default=0.0)
        if until > now:
            wait_s = max(1, round(until - now))
            raise TooManyAttempts(f"too many failed attempts; try again in {wait_s} s",
                                  retry_after_s=wait_s)

    async def failed(self, keys: Mapping[str, str]) -> float:
        """Counts the failure for each key, locks those past their policy's limit; the
        seconds to wait before answering."""
        now, delay_s = self._clock(), 0.0
        for kind, key in keys.items():
            policy = self._policies[kind]
            failures = await self._store.add(self._name(kind, key), now, policy.window_s)
            delay_s = max(delay_s, _slow_s(policy, failures.count))
            if policy.lock_after is not None and failures.count >= policy.lock_after:
                extra = failures.count - policy.lock_after
                await self._store.lock(self._name(kind, key), now + min(
                    policy.lock_first_s * 2 ** min(extra, 30), policy.lock_max_s))
        return delay_s

    async def succeeded(self, keys: Mapping[str, str]) -> None:
        await self._store.clear(self._names(keys))

    async def locked(self) -> dict[str, Failures]:
        """Every locked key (kind:key) and its failures, e.g. for an admin to see."""
        return await self._store.locked(self._clock())

    def _names(self, keys: Mapping[str, str]) -> list[str]:
        return [self._name(kind, key) for kind, key in keys.items()]

    @staticmethod
    def _name(kind: str, key: str) -> str:
        return f"{kind}:{key}"


def _slow_s(policy: Policy, count: int) -> float:
    if count <= policy.free:
        return 0.0
    return min(SLOW_FIRST_S * 2 ** min(count - policy.free - 1, 30), policy.slow_max_s)
