"""Progress of a job on stderr: its steps, and every few seconds the Spark tasks done of the
stages running (Spark's own console bar is off: it garbles other output)."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark import SparkContext


class Progress:
    def __init__(self, spark_context: SparkContext | None = None, *, every_s: float = 2.0,
                 stream: TextIO | None = None) -> None:
        self._context = spark_context
        self._every_s = every_s
        self._stream = stream or sys.stderr
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self, message: str) -> None:
        print(f"[{self.elapsed_s:6.1f}s] {message}", file=self._stream, flush=True)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def __enter__(self) -> Progress:
        if self._context is not None:
            self._thread = threading.Thread(target=self._watch, name="spark-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        assert self._context is not None
        tracker = self._context.statusTracker()
        while not self._stop.wait(self._every_s):
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            running = [s for s in stages if s is not None]
            if running:
                text = ", ".join(f"stage {s.stageId} {s.numCompletedTasks}/{s.numTasks} tasks"
                                 for s in running)
                self.step(f"  spark: {text}")
