"""Issue 10's chaos suite: under a steady load of client send()s, the receiver, the dispatcher
and a compensator are killed with -9 and restarted, tansu (on S3 storage), the RabbitMQ node
and MongoDB are stopped and restarted, and a subscriber answers 503 for a while, at moments
drawn from a seeded RNG (tests/support/chaos.py). Every message whose send() returned must
reach every subscriber (lost == 0), with duplicates under 1 % of the deliveries.

The seed is printed; `MSGBUS_CHAOS_SEED=N pytest tests/chaos -s` replays a schedule, and
`python -m bench.chaos` runs the same scenario longer from a shell. Run with -s to see the
schedule, the progress and the accounting.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from tests.support.chaos import ChaosConfig, run_chaos
from tests.support.deployment import Servers

pytestmark = pytest.mark.integration

LOAD_S = 60.0  # 10 s of lead (warm-up), a 42 s fault window, 8 s of tail
RATE_PER_S = 200.0
QUIET_TIMEOUT_S = 120.0
MAX_DUPLICATE_RATE = 0.01


def test_no_message_is_lost_while_parts_and_dependencies_fail(
        private_servers: Servers, tmp_path: Path) -> None:
    seed = int(os.environ.get("MSGBUS_CHAOS_SEED") or random.SystemRandom().randrange(1_000_000))
    print(f"\nchaos seed {seed} (MSGBUS_CHAOS_SEED={seed} replays this schedule)")
    config = ChaosConfig(seed=seed, duration_s=LOAD_S, rate_per_s=RATE_PER_S,
                         quiet_timeout_s=QUIET_TIMEOUT_S)
    result = run_chaos(private_servers, tmp_path, config)
    print(result.phases.report())
    print(result.fault_table())
    print(result.table())
    print(json.dumps(result.as_json()))

    totals = result.totals
    assert totals.sent > 0.8 * RATE_PER_S * LOAD_S, f"the load fell short: {totals.sent} sent"
    assert not result.send_errors, f"send() raised: {result.send_errors}"
    assert totals.lost == 0, (
        f"seed {seed}: {totals.lost} deliveries lost ({totals.lost_messages} messages); e.g.\n"
        f"{result.lost_examples}")
    assert totals.duplicate_rate < MAX_DUPLICATE_RATE, (
        f"seed {seed}: {totals.duplicates} duplicates of {totals.expected} deliveries")
    assert not result.problems, result.problems
    unrecorded = {a.subscription: a.expected - (a.recorded_delivered or 0)
                  for a in result.accounts if a.recorded_delivered != a.expected}
    assert not unrecorded, f"seed {seed}: not marked delivered in MongoDB: {unrecorded}"
