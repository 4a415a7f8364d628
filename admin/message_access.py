"""Who reads a destination's messages (bodies and traces): the members of its team and of every
team with a subscription to it (msgbus/permissions.py), and an admin who broke the glass
(`POST /v1/break-glass`, for at most an hour). Every refusal and every read through broken
glass is written to the audit log."""

from __future__ import annotations

from datetime import datetime

from msgbus.errors import Forbidden
from msgbus.permissions import Right, may, may_read_messages
from msgbus.store import MongoStore
from msgbus.store.users import UserStore
from msgbus.users import Principal

MAX_BREAK_GLASS_S = 3600


class MessageAccess:
    def __init__(self, store: MongoStore, users: UserStore) -> None:
        self._store = store
        self._users = users

    async def readers(self) -> dict[str, set[str]]:
        """Destination -> the teams that read its messages."""
        teams = {d.code: d.team for d in await self._store.config.list_destinations()}
        readers = {code: {team} for code, team in teams.items()}
        for sub in await self._store.config.list_subscriptions():
            readers.get(sub.destination, set()).add(sub.owning_team(teams))
        return readers

    async def readable(self, who: Principal) -> set[str] | None:
        """The destinations whose messages `who` reads (None: all, through broken glass)."""
        if await self._glass_broken(who) is not None:
            return None
        return {code for code, teams in (await self.readers()).items()
                if may_read_messages(who, teams)}

    async def check(self, who: Principal, destination: str, what: str) -> None:
        """Forbidden (audited) unless `who` reads `destination`'s messages; a read through
        broken glass is audited too. `what`: the message or query, for the audit log."""
        teams = (await self.readers()).get(destination, set())
        if may_read_messages(who, teams):
            return
        until = await self._glass_broken(who)
        if until is not None:
            await self._users.audit(who, "messages.read_through_broken_glass", destination,
                                    {"what": what, "glass_broken_until": until.isoformat()})
            return
        await self._users.audit(who, "messages.read_refused", destination, {"what": what})
        raise Forbidden(
            f"{who.name} may not read the messages of {destination}: that needs a member of "
            f"{' or '.join(sorted(teams)) or 'its team'} (its team and the teams that "
            "subscribe to it); an admin breaks the glass first (POST /v1/break-glass, audited)")

    async def _glass_broken(self, who: Principal) -> datetime | None:
        if not may(who, Right.ADMINISTER, None):
            return None
        return await self._users.glass_broken_until(who.name)
