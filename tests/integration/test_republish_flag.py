"""A receiver's ingest pipeline on a buffer that already held messages (a dead receiver's
buffer being adopted, or its own after a restart) may publish them a second time: those go out
flagged `redelivered`, so the dispatcher looks them up before pushing; what the pipeline's own
receiver accepts later goes out unflagged and costs MongoDB no lookup. Real LMDB buffer,
tansu and SecantusDB."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from pydantic import SecretStr

from msgbus import codec
from msgbus.brokers.base import topic_name
from msgbus.ids import uuid7
from msgbus.models import BrokerKind, Destination, Envelope, utcnow
from msgbus.registry import Registry
from msgbus.settings import ConnectionSettings, ReceiverSettings
from msgbus.store import MongoStore
from receiver.draining import open_buffer
from receiver.intake import Intake
from receiver.pipeline import IngestPipeline
from receiver.publishers import PublisherSet, build_publishers

pytestmark = pytest.mark.integration


def accepted(destination: str, count: int) -> list[Envelope]:
    now = utcnow()
    return [Envelope(message_id=uuid7(), destination=destination, body=b"{}", created_at=now,
                     received_at=now) for _ in range(count)]


def published_flags(bootstrap: str, destination: str, expected: int) -> dict[str, bool]:
    """message id -> redelivered flag, of every record of the destination's topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic_name(destination)])
    flags: dict[str, bool] = {}
    try:
        for _ in range(300):
            for record in consumer.consume(100, timeout=0.1):
                if record.error() is None:
                    envelope = codec.decode(record.value() or b"")
                    flags[envelope.message_id] = envelope.redelivered
            if len(flags) >= expected:
                break
    finally:
        consumer.close()
    return flags


async def test_a_buffers_inherited_messages_are_published_flagged_redelivered(
        mongo_uri: str, mongo_db_name: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    settings = ReceiverSettings(drainer="inline", connections=ConnectionSettings(
        mongo_uri=mongo_uri, mongo_db=mongo_db_name, kafka_bootstrap=kafka_bootstrap,
        internal_token=SecretStr("t"), state_dir=tmp_path / "state"))
    code = f"republish-{uuid.uuid4().hex[:8]}"
    store = MongoStore(mongo_uri, mongo_db_name)
    await store.ensure_indexes()
    await store.save_destination(Destination(code=code, broker=BrokerKind.KAFKA))
    buffer = open_buffer(settings, tmp_path / "buffer")
    left_behind = accepted(code, 20)
    await Intake(buffer).accept(left_behind)  # by a receiver that died before draining them

    registry = Registry(store, refresh_s=0.5)
    publishers = PublisherSet(build_publishers(settings))
    await registry.start()
    await publishers.start()
    pipeline = IngestPipeline(buffer, store, registry, publishers, publish_batch=50,
                              record_batch=50)
    pipeline.start()
    try:
        await asyncio.sleep(0.01)
        fresh = accepted(code, 20)
        await Intake(buffer).accept(fresh)  # by the receiver this pipeline drains for
        for _ in range(300):
            if not any(pipeline.depths().values()):
                break
            await asyncio.sleep(0.1)
        flags = await asyncio.to_thread(published_flags, kafka_bootstrap, code, 40)
    finally:
        await pipeline.close()
        await publishers.close()
        await registry.close()
        await store.close()
        buffer.close()

    assert {e.message_id: True for e in left_behind} == {
        m: flags.get(m) for m in (e.message_id for e in left_behind)}
    assert {e.message_id: False for e in fresh} == {
        m: flags.get(m) for m in (e.message_id for e in fresh)}
