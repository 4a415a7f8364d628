"""Teams: who owns destinations, subscriptions and producer apps, and who may act on them.

A team has members, each an owner (also manages the members), a maintainer (changes and
operates what the team owns) or a viewer (reads it). What the rights are is in
msgbus/permissions.py; the teams themselves are stored by msgbus/store/teams.py.

Before teams, a destination named its owner in a free-text label (`owner`). On upgrade the
label becomes a team's name (`team_of_label`): "Payments Team" is team `payments-team`. What
had no label belongs to `PLATFORM_TEAM`, the bus's own operators, until an admin gives it to a
team; a subscription or producer app stored without a team belongs to its destination's team
(the first destination an app may send to).
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

TEAM_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
PLATFORM_TEAM = "platform"

TeamName = Annotated[str, Field(pattern=TEAM_PATTERN, description="a team's name")]


class TeamRole(StrEnum):
    VIEWER = "viewer"
    MAINTAINER = "maintainer"
    OWNER = "owner"

    @property
    def rank(self) -> int:
        return list(TeamRole).index(self)

    def allows(self, needed: TeamRole) -> bool:
        return self.rank >= needed.rank


class Member(BaseModel):
    user: str = Field(max_length=200, description="a user's name (local or from the company's "
                                                  "identity provider)")
    role: TeamRole
    # "oidc": from a group of the company's identity provider, which every sign-in and refresh
    # sets again; "local": added here, which sign-ins leave alone
    source: Literal["local", "oidc"] = "local"


class Team(BaseModel):
    """A team as stored (`teams` collection; `_id` is its name)."""

    name: Annotated[str, Field(alias="_id", pattern=TEAM_PATTERN)]
    description: str = Field(default="", max_length=2000)
    members: list[Member] = Field(default_factory=list, max_length=10_000)
    # where the team is told about its subscriptions (msgbus/notify.py): a webhook, signed
    # with `notify_secret` as pushes are
    notify_url: str | None = Field(default=None, max_length=2083, pattern=r"^https?://")
    notify_secret: str | None = Field(default=None, pattern=r"^(whsec_|mbsealed:)")  # sealed
    created_at: datetime
    updated_at: datetime

    def role_of(self, user: str) -> TeamRole | None:
        return next((m.role for m in self.members if m.user == user), None)


def team_of_label(label: str) -> str:
    """The team a free-text owner label of the previous version becomes."""
    name = re.sub(r"[^a-z0-9]+", "-", label.strip().lower()).strip("-")[:63].strip("-")
    return name or PLATFORM_TEAM
