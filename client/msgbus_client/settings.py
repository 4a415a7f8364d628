"""One typed settings object for a client (sync or async). The API key is deliberately not here:
settings may be logged or shown, the key never is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from msgbus_client.spool import DEFAULT_MAX_SPOOL_BYTES


@dataclass(frozen=True, slots=True)
class ClientSettings:
    receiver_url: str
    spool_dir: Path | None = None  # a dir this process owns ...
    spool_root: Path | None = None  # ... or a root shared by processes: each takes a free slot
    max_slots: int = 64
    # 0: one fsync'd commit per send(). > 0: group commit: concurrent send()s share one commit; a
    # sender waits at most this long for senders already encoding their message to join.
    group_commit_ms: float = 0.0
    max_group_messages: int = 1000
    max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES
    # True: send() POSTs its message right after spooling it (backpressure, lowest latency);
    # False: send() returns once spooled and the background resender delivers in batches.
    inline_send: bool = True
    # at most this many inline POSTs at once; a send() beyond it leaves its message to the
    # resender (batched) instead of queueing for a connection
    max_inline_requests: int = 32
    request_timeout_s: float = 10.0
    connect_timeout_s: float = 3.0
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    max_retry_after_s: float = 600.0
    max_batch_messages: int = 100
    max_batch_bytes: int = 1_000_000
    idle_poll_s: float = 5.0

    def __post_init__(self) -> None:
        if (self.spool_dir is None) == (self.spool_root is None):
            raise ValueError("give exactly one of spool_dir and spool_root")
        if not self.receiver_url.startswith(("http://", "https://")):
            raise ValueError(f"receiver_url must be an http(s) URL, got {self.receiver_url!r}")
        positive = {
            "max_group_messages": self.max_group_messages,
            "max_slots": self.max_slots,
            "max_inline_requests": self.max_inline_requests,
            "max_spool_bytes": self.max_spool_bytes,
            "request_timeout_s": self.request_timeout_s,
            "connect_timeout_s": self.connect_timeout_s,
            "retry_base_s": self.retry_base_s,
            "retry_max_s": self.retry_max_s,
            "max_retry_after_s": self.max_retry_after_s,
            "max_batch_messages": self.max_batch_messages,
            "max_batch_bytes": self.max_batch_bytes,
            "idle_poll_s": self.idle_poll_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.group_commit_ms < 0:
            raise ValueError("group_commit_ms must be >= 0")

    @property
    def group_commit(self) -> bool:
        return self.group_commit_ms > 0
