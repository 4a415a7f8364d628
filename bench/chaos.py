"""`python -m bench.chaos`: the chaos run of issue 10 (msgbus_devtools/testkit/chaos.py) from
a shell.

    python -m bench.chaos                              # 120 s of load, a random seed
    python -m bench.chaos --duration-s 300 --seed 42 --rate 250

It starts private servers (SecantusDB, moto + tansu, a RabbitMQ node) in a temporary directory,
runs the bus as separate processes under a steady load of client send()s while faults strike at
seeded random moments, waits until every message reached every subscriber (bounded), and prints
the schedule, progress, the accounting table and, as the last line, one JSON object (`sent`,
`delivered`, `duplicates`, `duplicate_rate`, `lost`, `seed`, per-fault timings, ...). Exit code
1 when a message was lost or something went wrong, else 0. Everything it started is stopped
by PID at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

from msgbus_devtools.testkit.chaos import ChaosConfig, run_chaos
from msgbus_devtools.testkit.deployment import start_servers
from msgbus_devtools.testkit.procs import say


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=120.0,
                        help="load duration, at least (default 120; faults repeat every 45 s)")
    parser.add_argument("--rate", type=float, default=ChaosConfig.rate_per_s,
                        help="client send()s per second (default %(default).0f)")
    parser.add_argument("--sweep-after-s", type=float, default=ChaosConfig.sweep_after_s,
                        help="the compensators' MSGBUS_COMPENSATOR_SWEEP_AFTER_S "
                             "(default %(default).0f)")
    parser.add_argument("--max-in-flight", type=int, default=ChaosConfig.max_in_flight,
                        help="every subscription's in-flight budget, which bounds what a "
                             "dispatcher killed with -9 pushes again (default %(default)s; 0: "
                             "the product's default, max(64, 4 x max_concurrency))")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--quiet-timeout-s", type=float, default=300.0,
                        help="how long to wait for the last deliveries (default 300)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep servers' data and logs here (default: a temp dir, removed)")
    return parser.parse_args(argv)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    config = ChaosConfig(seed=seed, duration_s=args.duration_s, rate_per_s=args.rate,
                         quiet_timeout_s=args.quiet_timeout_s,
                         sweep_after_s=args.sweep_after_s, max_in_flight=args.max_in_flight)
    say(f"chaos run: seed {seed}, {config.rate_per_s:.0f} msg/s for {config.duration_s:.0f} s, "
        f"{config.rounds} round(s) of faults")
    signal.signal(signal.SIGTERM, _terminate)
    with tempfile.TemporaryDirectory(prefix="msgbus-chaos-") as tmp:
        base = args.workdir or Path(tmp)
        servers = start_servers(base / "servers")
        try:
            result = run_chaos(servers, base / "run", config)
        finally:
            servers.close()
    print(result.phases.report())
    print(result.fault_table())
    print(result.table())
    if result.lost_examples:
        print(f"lost messages, e.g.:\n{result.lost_examples}")
    for problem in result.problems:
        print(f"problem: {problem}")
    print(json.dumps(result.as_json()), flush=True)
    return 1 if result.totals.lost or result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
