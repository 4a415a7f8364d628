"""Secrets the CLI keeps in the state directory (mode 0600) when the environment gives none."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


def read_or_create(path: Path, make: Callable[[], str] = lambda: secrets.token_urlsafe(32)
                   ) -> str:
    """The secret stored at `path`, created (`make()`, a random token) if missing."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = make()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return value


def write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
