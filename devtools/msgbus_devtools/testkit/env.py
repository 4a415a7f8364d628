"""The environment of a bus process that a test or a benchmark starts, and of the services they
run in their own process: exactly the MSGBUS_* variables they set (none inherited from the
shell), plus what every such bus has:

- pushes allowed to loopback, where their subscribers listen (the egress policy refuses
  internal addresses by default: msgbus/egress.py);
- one key that seals stored secrets (msgbus/sealing.py), the same for every process, so that
  what one seals another opens. For tests and benchmarks only: it is in the repository.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from msgbus.egress import LOOPBACK_ONLY

TEST_SECRET_KEYS = "test:hO7E0GGCd_q4bOvPQ3SJL-2lq_XBZaxXCz03J-ZkWYQ="
TEST_BUS_ENV = {"MSGBUS_PUSH_ALLOW_NETWORKS": LOOPBACK_ONLY,
                "MSGBUS_SECRET_KEYS": TEST_SECRET_KEYS,
                # SecantusDB, the tests' MongoDB, scans the whole collection for an index walk
                # (msgbus/store/skipscan.py)
                "MSGBUS_MONGO_INDEX_SKIP_SCANS": "false"}


def service_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without its MSGBUS_* variables, with TEST_BUS_ENV, and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSGBUS_")}
    return env | TEST_BUS_ENV | dict(extra or {})


def set_test_bus_env() -> None:
    """TEST_BUS_ENV for the services a test or benchmark runs in its own process (their
    settings read os.environ), where not set already."""
    for name, value in TEST_BUS_ENV.items():
        os.environ.setdefault(name, value)
