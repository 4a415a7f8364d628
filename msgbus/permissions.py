"""Who may do what: the one rule set, enforced by the admin API, its UI and the CLI (which
calls the API). docs/operations.md shows it as a table (`rules_table()`; a test keeps the two
the same).

A right is held on a team's things (its destinations, subscriptions and producer apps) by the
team's members, by their role in it; or on everything, by a bus-wide role (`Role`: every user
has one). Bus-wide, a viewer sees the catalogue only, an operator is the bus's on-call (reads
and operates everything), an admin also changes everything and administers the bus.

Messages (bodies and traces) are the exception: a destination's are read by the members of its
team and of every team with a subscription to it (`may_read_messages`), and by nobody else,
admins included, unless an admin breaks the glass (audited, for at most an hour).
"""

from __future__ import annotations

from enum import StrEnum

from msgbus.errors import Forbidden
from msgbus.models import Destination, PublishPolicy, SubscribePolicy
from msgbus.teams import TeamRole
from msgbus.users import Principal, Role


class Right(StrEnum):
    SEE_CATALOGUE = "see the catalogue"  # each destination's description, team and schemas
    READ = "read"  # configuration, health, parked and scheduled messages, replays, pushers
    OPERATE = "operate"  # pause, resume, replay, re-drive, skip, discard, test pushes
    CHANGE = "change"  # create, change and delete; secrets, schemas, producer keys
    MANAGE_MEMBERS = "manage members"  # of the team
    ADMINISTER = "administer the bus"  # runtime settings, users, teams, invalid documents
    READ_MESSAGES = "read messages"  # bodies and traces: the destination's and its subscribers'


_READ = frozenset({Right.SEE_CATALOGUE, Right.READ, Right.READ_MESSAGES})
TEAM_RIGHTS: dict[TeamRole, frozenset[Right]] = {
    TeamRole.VIEWER: _READ,
    TeamRole.MAINTAINER: _READ | {Right.OPERATE, Right.CHANGE},
    TeamRole.OWNER: _READ | {Right.OPERATE, Right.CHANGE, Right.MANAGE_MEMBERS},
}
BUS_RIGHTS: dict[Role, frozenset[Right]] = {
    Role.VIEWER: frozenset({Right.SEE_CATALOGUE}),
    Role.OPERATOR: frozenset({Right.SEE_CATALOGUE, Right.READ, Right.OPERATE}),
    Role.ADMIN: frozenset(Right) - {Right.READ_MESSAGES},  # unless the glass is broken
}


def may(who: Principal, right: Right, team: str | None) -> bool:
    """Whether `who` holds `right` on what `team` owns (None: on the bus itself)."""
    if right in BUS_RIGHTS[who.role]:
        return True
    role = None if team is None else who.teams.get(team)
    return role is not None and right in TEAM_RIGHTS[role]


def may_read_messages(who: Principal, readers: set[str]) -> bool:
    """Whether `who` reads a destination's messages: `readers` are its team and the teams
    with a subscription to it."""
    return any(may(who, Right.READ_MESSAGES, team) for team in readers)


def check(who: Principal, right: Right, team: str | None) -> None:
    """Forbidden, naming the right that is missing, unless `may(who, right, team)`."""
    if may(who, right, team):
        return
    if team is None:
        raise Forbidden(f"{who.name} may not {right}: that needs the bus-wide role "
                        f"{_least_bus_role(right)}")
    needed = _least_team_role(right)
    role = who.teams.get(team)
    has = f"is a {role} of team {team}" if role else f"is not a member of team {team}"
    raise Forbidden(f"{who.name} may not {right} what team {team} owns: that needs a {needed} "
                    f"of {team} (or the bus-wide role {_least_bus_role(right)}); {who.name} {has}")


def holds_somewhere(who: Principal, right: Right) -> bool:
    """Whether `who` holds `right` on the bus or on at least one team's things."""
    return right in BUS_RIGHTS[who.role] or any(right in TEAM_RIGHTS[r]
                                                for r in who.teams.values())


def check_somewhere(who: Principal, right: Right) -> None:
    """Forbidden unless `holds_somewhere(who, right)`: a request that makes something is
    refused early, before what it names is looked at."""
    if holds_somewhere(who, right):
        return
    raise Forbidden(f"{who.name} may not {right} anything: that needs a "
                    f"{_least_team_role(right)} of a team (or the bus-wide role "
                    f"{_least_bus_role(right)}); {who.name} is "
                    + (f"a {' or '.join(sorted(set(who.teams.values())))} of its teams"
                       if who.teams else "in no team"))


def may_publish(app: str, app_team: str, destination: Destination) -> bool:
    """Whether producer app `app` of `app_team` may send to `destination` (its own list of
    destinations is checked besides)."""
    if destination.publishers is PublishPolicy.ANY:
        return True
    listed = app in destination.publisher_apps
    return listed or (destination.publishers is PublishPolicy.TEAM
                      and app_team == destination.team)


def check_publish(app: str, app_team: str, destination: Destination) -> None:
    if may_publish(app, app_team, destination):
        return
    takes = (f"the apps of team {destination.team}"
             if destination.publishers is PublishPolicy.TEAM else "listed apps only")
    raise Forbidden(f"producer app {app!r} (team {app_team}) may not send to "
                    f"{destination.code!r}: it takes {takes} and those its team lists "
                    "(publisher_apps)", field="destination")


def may_subscribe(team: str, destination: Destination) -> bool:
    """Whether a subscription of `team` may be made to `destination` without its team's
    approval."""
    if destination.subscribers is SubscribePolicy.ANY or team == destination.team:
        return True
    return (destination.subscribers is SubscribePolicy.TEAMS
            and team in destination.subscriber_teams)


def _least_team_role(right: Right) -> str:
    return next((str(r) for r in TeamRole if right in TEAM_RIGHTS[r]), "nobody")


def _least_bus_role(right: Right) -> str:
    return next((str(r) for r in Role if right in BUS_RIGHTS[r]), "admin, with the glass broken")


def rules_table() -> str:
    """The rules as the Markdown table docs/operations.md shows."""
    columns = [f"team {r}" for r in TeamRole] + [f"bus-wide {r}" for r in Role]
    lines = ["| right | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for right in Right:
        cells = ["yes" if right in TEAM_RIGHTS[r] else "" for r in TeamRole]
        cells += ["yes" if right in BUS_RIGHTS[r] else "" for r in Role]
        lines.append(f"| {right} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
