"""One typed settings object for a client (sync or async). The API key is deliberately not here:
settings may be logged or shown, the key never is.

Both clients take the same keywords: `spool_dir` / `spool_root` (any path-like) and the
`ClientOptions`, which are the `ClientSettings` fields of the same names; defaults and checks
are written once, here.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TypedDict, Unpack

from msgbus_client.spool import DEFAULT_MAX_SPOOL_BYTES

StrPath = str | PathLike[str]


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
    # True: send() validates each message against its destination's payload schema (fetched
    # from the receiver, kept schema_ttl_s) and raises SchemaValidationError before spooling
    validate: bool = False
    schema_ttl_s: float = 60.0

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
            "schema_ttl_s": self.schema_ttl_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.group_commit_ms < 0:
            raise ValueError("group_commit_ms must be >= 0")

    @classmethod
    def from_options(
        cls,
        receiver_url: str,
        *,
        spool_dir: StrPath | None = None,
        spool_root: StrPath | None = None,
        **options: Unpack[ClientOptions],
    ) -> ClientSettings:
        """The settings for a client's keyword arguments (paths as str or path-like)."""
        return cls(
            receiver_url=receiver_url,
            spool_dir=None if spool_dir is None else Path(spool_dir),
            spool_root=None if spool_root is None else Path(spool_root),
            **options,
        )

    @property
    def group_commit(self) -> bool:
        return self.group_commit_ms > 0


class ClientOptions(TypedDict, total=False):
    """The keyword options of MsgbusClient and AsyncMsgbusClient besides the spool path and the
    transport: each is the ClientSettings field of the same name (meaning and default there)."""

    max_slots: int
    group_commit_ms: float
    max_group_messages: int
    max_spool_bytes: int
    inline_send: bool
    max_inline_requests: int
    request_timeout_s: float
    connect_timeout_s: float
    retry_base_s: float
    retry_max_s: float
    max_retry_after_s: float
    max_batch_messages: int
    max_batch_bytes: int
    idle_poll_s: float
    validate: bool
    schema_ttl_s: float
