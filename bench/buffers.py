"""How many entries wait in receivers' LMDB buffers, read from outside the receivers.

A receiver with several workers has one buffer slot per worker and answers /health from
whichever worker the connection lands on, so the benchmark reads the slots itself: LMDB lets
other processes open an environment read-only while its owner writes. Every named database
counts except the dedupe indexes (names starting with "_"), so this does not depend on which
queues the receiver keeps.
"""

from __future__ import annotations

from pathlib import Path

import lmdb

from receiver.bufferslots import LMDB_DATA_FILE, slots

_MAX_DBS = 1024


def pending_entries(root: Path) -> int:
    """Entries in every queue of every slot under a receiver's buffer root."""
    total = 0
    for slot in slots(root):
        if (slot / LMDB_DATA_FILE).is_file():
            total += _slot_entries(slot)
    return total


def _slot_entries(slot: Path) -> int:
    env = lmdb.open(str(slot), readonly=True, lock=True, max_dbs=_MAX_DBS, readahead=False)
    try:
        with env.begin() as txn:
            names = [key for key, _ in txn.cursor() if not key.startswith(b"_")]
        total = 0
        for name in names:
            db = env.open_db(name, create=False)
            with env.begin() as txn:
                total += int(txn.stat(db)["entries"])
        return total
    finally:
        env.close()
