"""`promtool` (Prometheus's rule checker) for the deploy tests.

The one on PATH if any; else the one in Debian's `prometheus` package, downloaded with
`apt-get download` and unpacked (dpkg-deb -x) into a cache dir: nothing is installed, and no
Prometheus server is started.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CACHE = Path.home() / ".cache" / "msgbus" / "promtool"
PACKAGE = "prometheus"


class PromtoolUnavailable(RuntimeError):
    pass


def promtool() -> Path:
    found = shutil.which("promtool")
    if found:
        return Path(found)
    unpacked = CACHE / "usr" / "bin" / "promtool"
    if unpacked.is_file():
        return unpacked
    CACHE.mkdir(parents=True, exist_ok=True)
    package = _download()
    try:
        _run(["dpkg-deb", "-x", str(package), str(CACHE)])
    finally:
        package.unlink(missing_ok=True)
    if not unpacked.is_file():
        raise PromtoolUnavailable(f"{package.name} holds no usr/bin/promtool")
    return unpacked


def _download() -> Path:
    command = ["apt-get", "download", PACKAGE]
    done = subprocess.run(command, cwd=CACHE, capture_output=True, text=True)
    if done.returncode != 0:  # a fresh machine: its package lists come first
        _run(["apt-get", "update", "-qq"])
        _run(command, cwd=CACHE)
    found = sorted(CACHE.glob(f"{PACKAGE}_*.deb"))
    if not found:
        raise PromtoolUnavailable(f"`apt-get download {PACKAGE}` left no .deb in {CACHE}")
    return found[-1]


def _run(command: list[str], cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PromtoolUnavailable(f"`{' '.join(command)}`: {exc}") from exc
    if done.returncode != 0:
        raise PromtoolUnavailable(f"`{' '.join(command)}` failed: {done.stderr.strip()[-500:]}")
