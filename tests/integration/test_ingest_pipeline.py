"""The receiver's ingest pipeline on a real LMDB buffer, tansu and SecantusDB.

- A pipeline on a buffer that already held messages (a dead receiver's buffer being adopted, or
  its own after a restart) may publish them a second time: those go out flagged `redelivered`,
  so the dispatcher looks them up before pushing; what the pipeline's own receiver accepts
  later goes out unflagged and costs MongoDB no lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from msgbus_devtools.testkit.waiting import NotInTime, eventually, eventually_async
from pydantic import SecretStr

from msgbus import codec
from msgbus.brokers.base import topic_name
from msgbus.ids import uuid7
from msgbus.models import BrokerKind, Destination, Envelope, utcnow
from msgbus.registry import Registry
from msgbus.settings import ConnectionSettings, ReceiverSettings
from msgbus.store import MongoStore
from receiver.flushing import open_buffer
from receiver.intake import PUBLISH_QUEUE, Intake
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

    def consumed_all() -> bool:
        for record in consumer.consume(100, timeout=0.1):  # waits up to 0.1 s itself
            if record.error() is None:
                envelope = codec.decode(record.value() or b"")
                flags[envelope.message_id] = envelope.redelivered
        return len(flags) >= expected

    try:
        # bounded, not a failure here: the test's assertions show what is missing
        with contextlib.suppress(NotInTime):
            eventually(consumed_all, 30, f"{expected} records of {destination}", interval_s=0,
                       patient=False)
    finally:
        consumer.close()
    return flags


class Parts:
    """What a pipeline flushes into: a Kafka destination, MongoDB, the registry, publishers."""

    def __init__(self, mongo_uri: str, mongo_db: str, kafka_bootstrap: str,
                 tmp_path: Path) -> None:
        self.settings = ReceiverSettings(flusher="inline", connections=ConnectionSettings(
            mongo_uri=mongo_uri, mongo_db=mongo_db, kafka_bootstrap=kafka_bootstrap,
            internal_token=SecretStr("t"), state_dir=tmp_path / "state"))
        self.code = f"pipeline-{uuid.uuid4().hex[:8]}"
        self.store = MongoStore(mongo_uri, mongo_db)
        self.buffer = open_buffer(self.settings, tmp_path / "buffer")
        self.registry = Registry(self.store, refresh_s=0.5)
        self.publishers = PublisherSet(build_publishers(self.settings))

    async def start(self) -> None:
        await self.store.ensure_indexes()
        await self.store.config.save_destination(
            Destination(code=self.code, broker=BrokerKind.KAFKA))
        await self.registry.start()
        await self.publishers.start()

    def pipeline(self) -> IngestPipeline:
        return IngestPipeline(self.buffer, self.store, self.registry, self.publishers,
                              publish_batch=50, record_batch=50)

    async def close(self) -> None:
        await self.publishers.close()
        await self.registry.close()
        await self.store.close()
        self.buffer.close()


@pytest.fixture
async def parts(mongo_uri: str, mongo_db_name: str, kafka_bootstrap: str,
                tmp_path: Path) -> AsyncIterator[Parts]:
    running = Parts(mongo_uri, mongo_db_name, kafka_bootstrap, tmp_path)
    await running.start()
    yield running
    await running.close()


async def flushed(pipeline: IngestPipeline) -> None:
    await eventually_async(lambda: not any(pipeline.depths().values()), 30,
                           "the pipeline's buffer to be flushed", interval_s=0.1)


async def test_a_buffers_inherited_messages_are_published_flagged_redelivered(
        parts: Parts, kafka_bootstrap: str) -> None:
    code = parts.code
    left_behind = accepted(code, 20)
    await Intake(parts.buffer).accept(left_behind)  # by a receiver that died before flushing
    pipeline = parts.pipeline()
    pipeline.start()
    try:
        await eventually_async(lambda: pipeline.depths()[PUBLISH_QUEUE] == 0, 30,
                               "the inherited messages published", interval_s=0.01)
        fresh = accepted(code, 20)
        await Intake(parts.buffer).accept(fresh)  # by the receiver this pipeline flushes for
        await flushed(pipeline)
        flags = await asyncio.to_thread(published_flags, kafka_bootstrap, code, 40)
    finally:
        await pipeline.close()

    assert {e.message_id: True for e in left_behind} == {
        m: flags.get(m) for m in (e.message_id for e in left_behind)}
    assert {e.message_id: False for e in fresh} == {
        m: flags.get(m) for m in (e.message_id for e in fresh)}

