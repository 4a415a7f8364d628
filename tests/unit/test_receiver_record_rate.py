"""The receiver's own record rate applies until the runtime settings name one."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from msgbus.models import RuntimeConfig
from msgbus.settings import ConnectionSettings, ReceiverSettings
from receiver.service import ReceiverService


def test_the_receiver_setting_is_the_default_and_the_runtime_setting_overrides_it(
        tmp_path: Path) -> None:
    settings = ReceiverSettings(
        record_rate_per_s=7, flusher="inline",
        connections=ConnectionSettings(internal_token=SecretStr("t"), state_dir=tmp_path))
    service = ReceiverService(settings)  # nothing connects before start()
    assert service.flush_service is not None
    try:
        assert service.flush_service.pipeline.global_record_rate() == 7
        service.registry._runtime = RuntimeConfig(record_rate_per_s=0)
        assert service.flush_service.pipeline.global_record_rate() == 0  # 0 = unlimited, at runtime
    finally:
        service.buffer.close()
        service.slot.release()
