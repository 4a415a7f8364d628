"""Sliding-window offset tracking for Kafka consumers (pure, no I/O, not thread safe).

Each assigned partition has a window of fetched offsets. An offset leaves the window's front
only when it and every offset before it are done, so the committable offset is the lowest one
still in flight: a message stuck at 1001 holds the commit even when 1002-1010 are done.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

Partition = tuple[str, int]

_epochs = itertools.count(1)


@dataclass(frozen=True, slots=True)
class OffsetToken:
    """The ack handle of one Kafka record. `epoch` identifies the window that fetched it."""

    topic: str
    partition: int
    offset: int
    epoch: int


@dataclass(slots=True)
class PartitionWindow:
    epoch: int = field(default_factory=lambda: next(_epochs))
    pending: deque[int] = field(default_factory=deque)  # fetched offsets, ascending
    done: set[int] = field(default_factory=set)  # done offsets still behind a pending one
    next_offset: int | None = None  # the offset after the last fetched one
    committed: int | None = None  # the last offset handed to commit

    def add(self, offset: int) -> bool:
        """Track a fetched offset; False for a re-fetch of one already seen."""
        if self.next_offset is not None and offset < self.next_offset:
            return False
        self.pending.append(offset)
        self.next_offset = offset + 1
        return True

    def ack(self, offset: int) -> None:
        if not self.pending or offset < self.pending[0]:
            return
        self.done.add(offset)
        while self.pending and self.pending[0] in self.done:
            self.done.discard(self.pending.popleft())

    def unfetch_from(self, offset: int) -> None:
        """Forget the fetched offsets from `offset` on (never handed out): they are read again."""
        while self.pending and self.pending[-1] >= offset:
            self.done.discard(self.pending.pop())
        if self.next_offset is not None and offset < self.next_offset:
            self.next_offset = offset

    @property
    def in_flight(self) -> int:
        return len(self.pending) - len(self.done)

    @property
    def committable(self) -> int | None:
        """The next offset a restarted consumer should read: the lowest not yet done."""
        return self.pending[0] if self.pending else self.next_offset


class OffsetTracker:
    def __init__(self) -> None:
        self._windows: dict[Partition, PartitionWindow] = {}
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Fetched records not yet acked, over all partitions."""
        return self._in_flight

    def partitions(self) -> list[Partition]:
        return list(self._windows)

    def assign(self, partitions: list[Partition]) -> None:
        for tp in partitions:
            if tp not in self._windows:
                self._windows[tp] = PartitionWindow()

    def revoke(self, partitions: list[Partition]) -> None:
        for tp in partitions:
            window = self._windows.pop(tp, None)
            if window is not None:
                self._in_flight -= window.in_flight

    def unfetch_from(self, tp: Partition, offset: int) -> None:
        """Records of `tp` from `offset` on were never handed out (dropped from the buffer)."""
        window = self._windows.get(tp)
        if window is not None:
            before = window.in_flight
            window.unfetch_from(offset)
            self._in_flight += window.in_flight - before

    def in_flight_of(self, partitions: list[Partition]) -> int:
        return sum(w.in_flight for tp in partitions if (w := self._windows.get(tp)) is not None)

    def reset(self) -> None:
        self._windows.clear()
        self._in_flight = 0

    def add(self, topic: str, partition: int, offset: int) -> OffsetToken | None:
        """Track a fetched record; None when its partition is not assigned or it is a re-fetch."""
        window = self._windows.get((topic, partition))
        if window is None or not window.add(offset):
            return None
        self._in_flight += 1
        return OffsetToken(topic, partition, offset, window.epoch)

    def ack(self, token: OffsetToken) -> bool:
        """Mark a record done; False when its window is gone (revoked since it was fetched)."""
        window = self._windows.get((token.topic, token.partition))
        if window is None or window.epoch != token.epoch:
            return False
        before = window.in_flight
        window.ack(token.offset)
        self._in_flight += window.in_flight - before
        return True

    def to_commit(self, partitions: list[Partition] | None = None) -> dict[Partition, int]:
        """Offsets that moved past the last commit; marks them as committed."""
        moved: dict[Partition, int] = {}
        for tp in partitions if partitions is not None else list(self._windows):
            window = self._windows.get(tp)
            if window is None:
                continue
            offset = window.committable
            if offset is not None and (window.committed is None or offset > window.committed):
                window.committed = offset
                moved[tp] = offset
        return moved

    def commit_failed(self, tp: Partition, offset: int) -> None:
        """Forget a failed commit so the next round retries it."""
        window = self._windows.get(tp)
        if window is not None and window.committed == offset:
            window.committed = None
