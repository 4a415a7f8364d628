"""A service that starts while MongoDB is down serves the configuration an earlier run saved
(msgbus/registry.py); the saved file holds signing secrets, so only its owner may read it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from msgbus_devtools import servers as services
from pydantic import HttpUrl

from msgbus.models import BrokerKind, Destination, Subscription
from msgbus.registry import Registry
from msgbus.store import MongoStore

pytestmark = pytest.mark.integration


async def test_a_registry_started_while_mongodb_is_down_serves_the_saved_configuration(
        mongo_uri: str, mongo_db_name: str, tmp_path: Path) -> None:
    snapshot = tmp_path / "state" / "dispatcher-config.json"
    store = MongoStore(mongo_uri, mongo_db_name)
    subscription = Subscription(destination="orders", name="billing",
                                url=HttpUrl("http://127.0.0.1:9/hook"), max_concurrency=7)
    try:
        await store.config.save_destination(Destination(code="orders", broker=BrokerKind.KAFKA))
        await store.config.save_subscription(subscription)
        live = Registry(store, refresh_s=60, snapshot=snapshot)
        await live.start()
        await live.close()
        [saved] = live.subscriptions_of("orders")
    finally:
        await store.close()
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600

    down = MongoStore(f"mongodb://{services.HOST}:{services.free_port()}", "nowhere",
                      timeout_ms=300)
    restarted = Registry(down, refresh_s=60, snapshot=snapshot)
    try:
        await restarted.start()
        destination = restarted.known_destination("orders")
        assert destination is not None and destination.broker is BrokerKind.KAFKA
        [served] = restarted.subscriptions_of("orders")
        assert served == saved  # URL, concurrency and signing secrets alike
        assert served.signing_secrets == subscription.signing_secrets
    finally:
        await restarted.close()
        await down.close()
