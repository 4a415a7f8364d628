"""The environment of a bus process that a test or a benchmark starts, and of the services they
run in their own process: exactly the MSGBUS_* variables they set (none inherited from the
shell), and pushes allowed to loopback, where their subscribers listen (the egress policy
refuses internal addresses by default: msgbus/egress.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from msgbus.egress import LOOPBACK_ONLY

LOCAL_PUSHES = {"MSGBUS_PUSH_ALLOW_NETWORKS": LOOPBACK_ONLY}


def service_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without its MSGBUS_* variables, with pushes to loopback allowed, and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSGBUS_")}
    return env | LOCAL_PUSHES | dict(extra or {})


def allow_local_pushes() -> None:
    """For the services a test or benchmark runs in its own process (their settings read
    os.environ)."""
    for name, value in LOCAL_PUSHES.items():
        os.environ.setdefault(name, value)
