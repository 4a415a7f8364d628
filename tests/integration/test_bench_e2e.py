"""`python -m bench.e2e` with --quick's settings but shorter phases, issue 10's whole-system
benchmark, as CI runs it: receiver, dispatcher and compensator each a `msgbus` process on real
tansu, SecantusDB and RabbitMQ, the producer library's send() as the load, real HTTP
subscribers. Its figures are the benchmark's business (bench/README.md); the suite checks that
every message whose send() returned arrived, and that the report a user reads is complete."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# --quick's settings with shorter phases: the suite checks that the benchmark works, not its figures
SMALLER = ["--runs", "1", "--rate", "600", "--duration-s", "2", "--latency-s", "2",
           "--isolation-messages", "200"]


@pytest.mark.timeout(600)
def test_the_quick_whole_system_benchmark_loses_nothing_and_reports_its_figures(
        tmp_path: Path) -> None:
    plot = tmp_path / "latency.png"
    done = subprocess.run(
        [sys.executable, "-m", "bench.e2e", "--brokers", "kafka", "--plot", str(plot), *SMALLER],
        cwd=REPO, capture_output=True, text=True, timeout=540)
    output = f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, output
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["problems"] == [], output  # e.g. a message whose send() returned never arrived
    for figure in ("e2e_msgs_per_s", "overhead_p50_ms", "isolation_ratio", "bus_p99_ms"):
        assert isinstance(report[figure], int | float) and report[figure] > 0, (figure, output)
    assert set(report["goals"]) == {"e2e_msgs_per_s", "overhead_p50_ms", "isolation_ratio"}
    assert {"dispatcher", "receiver", "mongo", "tansu"} <= set(report["cpu_cores"]["kafka"])
    assert report["spread"]["kafka_recorded_per_s"]["median"] > 0  # MongoDB held every record
    assert plot.stat().st_size > 10_000, "the latency plot is missing or empty"
    assert "overhead_p50_ms" in done.stdout and "isolation_ratio" in done.stdout  # the table
