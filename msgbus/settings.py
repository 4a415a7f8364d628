"""Typed settings, read from `MSGBUS_*` environment variables.

One settings object per service, built at the entry point and passed in. Connection settings
are shared (`MSGBUS_MONGO_URI`, ...); a service's own knobs carry its prefix
(`MSGBUS_RECEIVER_PORT`, `MSGBUS_DISPATCHER_INSTANCE`, ...).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConnectionSettings(BaseSettings):
    """Where the shared dependencies live. Empty broker URLs mean that broker is not configured."""

    model_config = SettingsConfigDict(env_prefix="MSGBUS_", extra="ignore")

    mongo_uri: str = "mongodb://127.0.0.1:27017"
    mongo_db: str = "msgbus"
    kafka_bootstrap: str = ""
    rabbitmq_url: str = ""
    # Shared secret of the internal receiver -> dispatcher ("direct") endpoint. The CLI fills it
    # from <state_dir>/internal-token when the environment does not set it.
    internal_token: SecretStr = SecretStr("")
    state_dir: Path = Path(".msgbus")
    config_refresh_s: float = 2.0


class ReceiverSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MSGBUS_RECEIVER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8080
    max_message_bytes: int = 1024 * 1024
    max_batch_count: int = 500
    max_batch_bytes: int = 8 * 1024 * 1024
    buffer_dir: Path | None = None  # default: <state_dir>/receiver-buffer
    buffer_max_bytes: int = 2 * 1024**3
    # how long the receiver remembers accepted message ids, to answer a client's re-send
    # "duplicate" instead of publishing it again (per receiver instance)
    dedupe_window_s: float = 600.0
    mongo_batch_size: int = 500
    publish_batch_size: int = 500
    # Where the direct path hands messages (a dispatcher's internal endpoint).
    dispatcher_url: str = "http://127.0.0.1:8081"
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)


class DispatcherSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MSGBUS_DISPATCHER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8081
    instance: str = ""  # default: hostname-pid
    trace_dir: Path | None = None  # default: <state_dir>/dispatcher-trace
    trace_batch_size: int = 1000
    trace_flush_interval_ms: int = 100
    direct_queue_size: int = 10_000
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)


class CompensatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MSGBUS_COMPENSATOR_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8082
    scan_interval_s: float = 5.0
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)


class AdminSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MSGBUS_ADMIN_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8083
    # Bearer token for the management API until users and roles arrive; the CLI fills it from
    # <state_dir>/admin-token when the environment does not set it.
    token: SecretStr = SecretStr("")
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)
