"""`TeamStore`: the teams and their members (`teams` collection; `_id` is the team's name).

A user's teams are read at each authentication (one indexed query on `members.user`), so a
member removed from a team loses its rights with the next request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase

from msgbus.errors import NotFound
from msgbus.models import new_signing_secret, utcnow
from msgbus.store.checked import InvalidDocumentLog, Loaded, read_each, read_one, storable
from msgbus.teams import Member, Team, TeamRole


def _team(doc: dict[str, Any]) -> Team:
    return Team.model_validate(doc)


class TeamStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]],
                 invalid_log: InvalidDocumentLog, seal: Callable[[str], str]) -> None:
        self._teams = db["teams"]
        self._invalid_log = invalid_log
        self._seal = seal  # the notify secret is stored sealed (msgbus/sealing.py)

    async def roles_of(self, user: str) -> dict[str, TeamRole]:
        """Team -> `user`'s role in it, for every team `user` is a member of."""
        found = [d async for d in self._teams.find({"members.user": user})]
        teams = read_each(found, "teams", _team, self._invalid_log).items
        return {team.name: role for team in teams if (role := team.role_of(user)) is not None}

    async def get(self, name: str) -> Team:
        doc = await self._teams.find_one({"_id": name})
        if doc is None:
            raise NotFound(f"unknown team {name!r}", field="team")
        return read_one(doc, "teams", _team, self._invalid_log)

    async def load(self) -> Loaded[Team]:
        found = [d async for d in self._teams.find().sort("_id", ASCENDING)]
        loaded = read_each(found, "teams", _team, self._invalid_log)
        self._invalid_log.whole_collection("teams", loaded.invalid)
        return loaded

    async def save(self, name: str, description: str, members: list[Member]) -> Team:
        """Creates the team or replaces its description and members (its notification
        target stays)."""
        now = utcnow()
        existing = await self._teams.find_one({"_id": name}) or {"created_at": now}
        doc = {**existing, "_id": name, "description": description,
               "members": [m.model_dump(mode="json") for m in members], "updated_at": now}
        await self._teams.replace_one({"_id": name}, storable(doc, _team), upsert=True)
        return _team(doc)

    async def set_notify_url(self, name: str, url: str | None) -> Team:
        """Where the team is told (None: nowhere); a first URL gets a signing secret."""
        team = await self.get(name)
        secret = team.notify_secret or (
            None if url is None else self._seal(new_signing_secret()))
        doc = {**team.model_dump(by_alias=True), "notify_url": url, "notify_secret": secret,
               "updated_at": utcnow()}
        await self._teams.replace_one({"_id": name}, storable(doc, _team))  # 422 if too long
        return _team(doc)

    async def set_member(self, name: str, user: str, role: TeamRole | None,
                         source: str = "local") -> Team:
        """`user` gets `role` in the team (None: leaves it)."""
        team = await self.get(name)
        members = [m for m in team.members if m.user != user]
        if role is not None:
            members.append(Member.model_validate({"user": user, "role": role, "source": source}))
        return await self.save(name, team.description, members)

    async def follow_groups(self, user: str, wanted: dict[str, TeamRole]) -> None:
        """`user`'s memberships from the identity provider become `wanted` (a team it names
        is made); those added here by hand stay as they are."""
        for team in (await self.load()).items:
            had = next((m for m in team.members if m.user == user), None)
            if had is not None and had.source == "oidc" and team.name not in wanted:
                await self.set_member(team.name, user, None)
        for name, role in wanted.items():
            try:
                team = await self.get(name)
            except NotFound:
                team = await self.save(name, "from the company's identity provider", [])
            member = next((m for m in team.members if m.user == user), None)
            if member is None or (member.source == "oidc" and member.role != role):
                await self.set_member(name, user, role, source="oidc")

    async def delete(self, name: str) -> None:
        await self._teams.delete_one({"_id": name})
