"""Producer authentication through a MongoDB outage.

The store is a fake here (the only way to make MongoDB fail exactly between two requests in a
unit test); the MongoDB-outage integration test exercises the same path against a real server.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from msgbus_devtools.testkit.waiting import eventually_async
from pymongo.errors import AutoReconnect

from msgbus.auth import hash_api_key
from msgbus.errors import Unauthorized, Unavailable
from msgbus.models import ProducerApp, utcnow
from receiver.producers import Producer, ProducerAuthenticator

KEY, OTHER_KEY = "mbk_known", "mbk_other"


class FakeAppStore:
    def __init__(self) -> None:
        self.apps: dict[str, ProducerApp] = {}
        self.down = False
        self.lookups = 0
        self.gate: asyncio.Event | None = None  # when set, lookups wait for it

    def add(self, key: str, name: str, destinations: list[str]) -> None:
        self.apps[hash_api_key(key)] = ProducerApp.model_validate({
            "_id": name, "key_hashes": [hash_api_key(key)], "destinations": destinations,
            "created_at": utcnow()})

    async def find_app_by_key_hash(self, key_hash: str) -> ProducerApp | None:
        self.lookups += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise AutoReconnect("connection refused")
        return self.apps.get(key_hash)


def bearer(key: str) -> str:
    return f"Bearer {key}"


async def until_unauthorized(auth: ProducerAuthenticator, key: str) -> list[str]:
    """Authenticate until the key is refused with 401; returns the answers before that."""
    answers: list[str] = []

    async def refused() -> bool:
        try:
            await auth.authenticate(bearer(key))
            answers.append("ok")
        except Unauthorized:
            return True
        except Unavailable:
            answers.append("503")
        return False

    await eventually_async(refused, 1, f"{key} refused with 401", interval_s=0.002,
                           progress=lambda: f"last answers {answers[-5:]}")
    return answers


@pytest.fixture
def store() -> FakeAppStore:
    store = FakeAppStore()
    store.add(KEY, "shop", ["orders"])
    return store


async def test_a_known_key_keeps_working_through_an_outage_logged_once(
        store: FakeAppStore, caplog: pytest.LogCaptureFixture) -> None:
    auth = ProducerAuthenticator(store, ttl_s=0.0)  # every request would look the key up
    assert await auth.authenticate(bearer(KEY)) == Producer("shop", frozenset({"orders"}))
    store.down = True
    with caplog.at_level(logging.WARNING, logger="receiver.producers"):
        for _ in range(20):
            assert (await auth.authenticate(bearer(KEY))).name == "shop"
            await asyncio.sleep(0.001)  # background lookups run and fail meanwhile

        def outage_logs() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "unavailable" in r.getMessage()]

        await eventually_async(outage_logs, 1, "the outage to be logged", interval_s=0.002)
    assert len(outage_logs()) == 1, caplog.text
    await auth.close()


async def test_an_unknown_key_during_an_outage_is_503_not_401(store: FakeAppStore) -> None:
    auth = ProducerAuthenticator(store)
    store.down = True
    for _ in range(2):  # the first finds the outage, the second answers without waiting
        with pytest.raises(Unavailable) as caught:
            await auth.authenticate(bearer(OTHER_KEY))
        assert caught.value.status_code == 503
        assert caught.value.retry_after_s is not None and caught.value.retry_after_s >= 1
    store.down = False  # the next request still gets 503, but its lookup ends the outage
    assert set(await until_unauthorized(auth, OTHER_KEY)) <= {"503"}
    await auth.close()


async def test_revocation_takes_effect_once_the_cache_entry_expires(store: FakeAppStore) -> None:
    cached = ProducerAuthenticator(store, ttl_s=3600.0)
    expiring = ProducerAuthenticator(store, ttl_s=0.0)
    for auth in (cached, expiring):
        assert (await auth.authenticate(bearer(KEY))).name == "shop"
    store.apps.clear()  # the key is revoked
    assert (await cached.authenticate(bearer(KEY))).name == "shop"  # within its TTL
    # expired: served once more while the background lookup finds the revocation
    assert set(await until_unauthorized(expiring, KEY)) <= {"ok"}
    await expiring.close()


async def test_revocation_applies_after_an_outage_ends(store: FakeAppStore) -> None:
    auth = ProducerAuthenticator(store, ttl_s=0.0)
    await auth.authenticate(bearer(KEY))
    store.down = True
    assert (await auth.authenticate(bearer(KEY))).name == "shop"
    store.apps.clear()
    store.down = False  # served stale until a background lookup notices the recovery
    assert set(await until_unauthorized(auth, KEY)) <= {"ok"}
    await auth.close()


async def test_concurrent_requests_share_one_lookup(store: FakeAppStore) -> None:
    auth = ProducerAuthenticator(store)
    store.gate = asyncio.Event()
    waiting = [asyncio.create_task(auth.authenticate(bearer(KEY))) for _ in range(50)]
    await eventually_async(lambda: store.lookups == 1, 1, "the first lookup", interval_s=0.002)
    store.gate.set()
    assert {p.name for p in await asyncio.gather(*waiting)} == {"shop"}
    assert store.lookups == 1


async def test_a_cancelled_request_does_not_cancel_the_shared_lookup(store: FakeAppStore) -> None:
    auth = ProducerAuthenticator(store)
    store.gate = asyncio.Event()
    first = asyncio.create_task(auth.authenticate(bearer(KEY)))
    second = asyncio.create_task(auth.authenticate(bearer(KEY)))
    await eventually_async(lambda: store.lookups == 1, 1, "the lookup", interval_s=0.002)
    first.cancel()
    store.gate.set()
    assert (await second).name == "shop"


async def test_unknown_keys_are_refused_from_the_cache(store: FakeAppStore) -> None:
    auth = ProducerAuthenticator(store)
    for _ in range(3):
        with pytest.raises(Unauthorized):
            await auth.authenticate(bearer(OTHER_KEY))
    with pytest.raises(Unauthorized):
        await auth.authenticate(None)
    assert store.lookups == 1
