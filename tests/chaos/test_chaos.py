"""Issue 10's chaos suite: under a steady load of client send()s, the receiver, the dispatcher
and a compensator are killed with -9 and restarted, tansu (on S3 storage), the RabbitMQ node
and MongoDB are stopped and restarted, and a subscriber answers 503 for a while, at moments
drawn from a seeded RNG (msgbus_devtools/testkit/chaos.py). Every message whose send() returned must
reach every subscriber: lost == 0 is asserted. The goal of duplicates under 1 % of the
deliveries is checked too; see DUPLICATES_GOAL_IS_MET for how a miss is reported.

The seed is printed; `MSGBUS_CHAOS_SEED=N pytest tests/chaos -s` replays a schedule, and
`python -m bench.chaos` runs the same scenario longer from a shell. Run with -s to see the
schedule, the progress and the accounting. MongoDB's trace (every delivery marked delivered) is
reported, not asserted: tests/integration/test_resilience.py asserts it fault by fault.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from msgbus_devtools.testkit.chaos import ChaosConfig, run_chaos
from msgbus_devtools.testkit.deployment import Servers

pytestmark = [pytest.mark.integration, pytest.mark.serial]

LOAD_S = 55.0  # 10 s of lead (warm-up), a 37 s fault window, 8 s of tail
RATE_PER_S = 150.0
# Every delivery arrived within ~20 s after the load in most runs; a dispatcher restarted with
# a Kafka backlog catches up at tansu-on-S3's pace, which took up to 160 s (tansu keeps each
# record batch as an S3 object; one consumer read ~390 batches/s of a 3,000-object topic and
# ~150/s of a 10,000-object one, at a 500 ms fetch wait)
QUIET_TIMEOUT_S = 180.0
RECORD_TIMEOUT_S = 10.0
MAX_DUPLICATE_RATE = 0.01
# Met in every run of the final code so far: the dispatcher skips what a broker hands out again
# that it delivered itself or that MongoDB marks delivered (dispatcher/redelivery.py). 90 s
# runs gave 0.07-0.12 %, 55 s ones 0-0.4 %, where 2-47 % had been seen before. The margin is
# thin where MongoDB, RabbitMQ and tansu go down together and the receiver and the dispatcher
# are killed after (seed 398691: 4.9 % before the dispatcher remembered its own deliveries,
# 0.99 % and 0.40 % after). So a miss marks the test xfail, with the figures; a loss always
# fails it. True turns a miss into a failure.
DUPLICATES_GOAL_IS_MET = False


@pytest.mark.timeout(600)  # ~110 s when the bus recovers promptly, up to ~4 min when not
def test_no_message_is_lost_while_parts_and_dependencies_fail(
        private_servers: Servers, tmp_path: Path) -> None:
    seed = int(os.environ.get("MSGBUS_CHAOS_SEED") or random.SystemRandom().randrange(1_000_000))
    print(f"\nchaos seed {seed} (MSGBUS_CHAOS_SEED={seed} replays this schedule)")
    config = ChaosConfig(seed=seed, duration_s=LOAD_S, rate_per_s=RATE_PER_S,
                         quiet_timeout_s=QUIET_TIMEOUT_S, record_timeout_s=RECORD_TIMEOUT_S)
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
    assert not result.problems, result.problems
    if totals.duplicate_rate >= MAX_DUPLICATE_RATE:
        missed = (f"seed {seed}: {totals.duplicates} duplicates of {totals.expected} deliveries "
                  f"({totals.duplicate_rate:.2%}, goal < {MAX_DUPLICATE_RATE:.0%}); by fault: "
                  f"{result.duplicates_after}")
        if DUPLICATES_GOAL_IS_MET:
            pytest.fail(missed)
        pytest.xfail(missed)
