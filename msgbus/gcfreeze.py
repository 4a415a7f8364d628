"""Keep the garbage collector's full passes short in the bus's long-running processes.

A service process imports some 60,000-100,000 objects (FastAPI, pydantic, pymongo,
confluent-kafka ...) that live as long as it does. Every full (generation 2) collection walks
all of them: 20-30 ms of CPU, and on a busy machine 50-180 ms during which the event loop and
the broker poll threads stand still. In `python -m bench.e2e` such a pause of the dispatcher
held every message of that moment: the largest spike of the latency phase (275 ms). Frozen
after start, those objects are never walked again, and a full pass walks only what the
service allocated since.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Call once the service has started (imports done, connections open)."""
    gc.collect()  # start-up's garbage first: once frozen, it would never be freed
    gc.freeze()
