"""Keep the garbage collector's full passes short in the bus's long-running processes.

A service process imports tens of thousands of objects (FastAPI, pydantic, pymongo,
confluent-kafka ...) that live as long as it does. Every full (generation 2) collection walks
all of them, and while it does the event loop and the broker poll threads stand still: a pause
of the dispatcher holds every message of that moment, so it shows as a latency spike. Frozen
after start, those objects are never walked again, and a full pass walks only what the
service allocated since. Figures: bench/RESULTS.md, "End to end" (where the latency at half
load goes).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

FULL_COLLECTION_WAIT_S = 2.0


def freeze_startup_objects() -> None:
    """Call once the service has started (imports done, connections open)."""
    collect_here()  # start-up's garbage first: once frozen, it would never be freed
    gc.freeze()


def collect_here(wait_s: float = FULL_COLLECTION_WAIT_S) -> None:
    """A full collection run by this thread. `gc.collect()` does nothing while another
    thread's collection is under way (its finalizers may let this thread run meanwhile), so
    it is tried again until one has run here."""
    me = threading.get_ident()
    ran = False

    def note(phase: str, info: dict[str, Any]) -> None:
        nonlocal ran
        if phase == "stop" and info["generation"] == 2 and threading.get_ident() == me:
            ran = True

    gc.callbacks.append(note)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            gc.collect()
            if ran:
                return
            if time.monotonic() > deadline:
                log.warning("no full garbage collection could run here before freezing "
                            "(other threads' went on for %.0f s): start-up's garbage they did "
                            "not free stays frozen", wait_s)
                return
            time.sleep(0.001)
    finally:
        gc.callbacks.remove(note)
