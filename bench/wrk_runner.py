"""Running `wrk` (Debian's wrk 4.x) with the scripts in bench/wrk/ and reading its results.

The scripts print one `WRK_JSON {...}` line from wrk's `done()` hook; `run_wrk` parses it into
a `WrkResult`. Each run gets a fresh message-id prefix (the first 18 characters of a UUIDv7),
so no two requests of any run carry the same message_id.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import orjson
from msgbus_devtools import servers as services

from msgbus.ids import uuid7

SCRIPTS = Path(__file__).resolve().parent / "wrk"
UNPACED = SCRIPTS / "ingest.lua"
PACED = SCRIPTS / "ingest_paced.lua"
_MARK = "WRK_JSON "


class WrkError(RuntimeError):
    """wrk is missing, failed, or printed no result."""


@dataclass(frozen=True)
class WrkResult:
    id_prefix: str  # every message_id of the run starts with it
    requests: int
    duration_s: float
    errors: dict[str, int]  # connect, read, write, status (non-2xx/3xx), timeout
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def ok_requests(self) -> int:
        """Requests answered 2xx (wrk counts the others under errors.status)."""
        return self.requests - self.errors.get("status", 0)


def wrk_binary() -> str:
    """wrk's path, installed from Debian's package first when missing (as root)."""
    found = shutil.which("wrk")
    if found is None:
        try:
            services.apt_install("wrk")
        except services.ServiceError as exc:
            raise WrkError(str(exc)) from exc
        found = shutil.which("wrk")
    if found is None:
        raise WrkError("wrk not found: `apt-get install wrk` (Debian package)")
    return found


def run_wrk(
    url: str, mode: str, destination: str, api_key: str, *, duration_s: int, threads: int,
    connections: int, batch_size: int = 100, rate_per_s: float | None = None,
    request_timeout_s: float = 10.0,
) -> WrkResult:
    """POST messages to `url` for `duration_s` (whole seconds: what wrk takes). `mode`:
    "single" or "batch". With `rate_per_s`, requests are paced at that total rate (spread over
    the threads), else sent as fast as the server answers."""
    script = UNPACED if rate_per_s is None else PACED
    id_prefix = uuid7()[:18]
    args = [mode, id_prefix, destination, api_key, str(batch_size)]
    if rate_per_s is not None:
        args.append(f"{rate_per_s / threads:.3f}")
    command = [wrk_binary(), f"-t{threads}", f"-c{connections}", f"-d{duration_s}s",
               f"--timeout={request_timeout_s:g}s", "-s", str(script), url, "--", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=duration_s + request_timeout_s + 30)
    except subprocess.TimeoutExpired as exc:
        raise WrkError(f"wrk did not finish: {' '.join(command)}") from exc
    return parse_output(id_prefix, done.stdout, done.stderr, done.returncode)


def parse_output(id_prefix: str, stdout: str, stderr: str = "", returncode: int = 0,
                 ) -> WrkResult:
    line = next((ln for ln in stdout.splitlines() if ln.startswith(_MARK)), None)
    if returncode != 0 or line is None:
        raise WrkError(f"wrk failed (exit {returncode}): {stderr.strip() or stdout.strip()}")
    data = orjson.loads(line[len(_MARK):])
    latency = data["latency_us"]
    return WrkResult(id_prefix=id_prefix, requests=int(data["requests"]),
                     duration_s=data["duration_us"] / 1e6,
                     errors={k: int(v) for k, v in data["errors"].items()},
                     p50_ms=latency["p50"] / 1000, p90_ms=latency["p90"] / 1000,
                     p99_ms=latency["p99"] / 1000, max_ms=latency["max"] / 1000)
