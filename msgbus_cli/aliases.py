"""Command names from before 0.2, kept for one release (docs/operations.md, "Renamed in 0.2"):
each still runs its command, is left out of --help, and says the new name on stderr."""

from __future__ import annotations

import copy

import click


def former_name(command: click.Command, name: str) -> click.Command:
    """`command` under `name`, hidden and marked deprecated; add it beside `command`."""
    alias = copy.copy(command)
    alias.name = name
    alias.hidden = True
    alias.deprecated = f"It is `{command.name}` since 0.2."
    return alias
