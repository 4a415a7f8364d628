"""The pipelines a receiver builds for adopted buffers leave nothing behind once closed."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from msgbus.settings import ConnectionSettings, ReceiverSettings
from receiver.flushing import FlushService, open_buffer
from receiver.service import ReceiverService


async def test_a_closed_pipeline_no_longer_listens_to_configuration_changes(
        tmp_path: Path) -> None:
    settings = ReceiverSettings(flusher="inline", connections=ConnectionSettings(
        internal_token=SecretStr("t"), state_dir=tmp_path / "state"))
    service = ReceiverService(settings)  # nothing connects before start()
    assert isinstance(service.flush_service, FlushService)
    listeners = len(service.registry._listeners)
    adopted = open_buffer(settings, tmp_path / "orphan")
    try:
        for _ in range(3):  # three adoptions
            pipeline = service.flush_service.pipeline_on(adopted)
            pipeline.start()
            assert len(service.registry._listeners) == listeners + 1
            await pipeline.close()
        assert len(service.registry._listeners) == listeners
    finally:
        adopted.close()
        service.buffer.close()
        service.slot.release()
