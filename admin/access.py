"""Each route's rule: the right it needs (msgbus/permissions.py) and on what.

`needs(right, on)` is a route's dependency. It authenticates the request (admin/security.py),
finds the team that owns what the path names (a destination's code, a subscription's code and
name, an app's or a team's name; `On.BUS`: the bus itself) and answers 403, naming the missing
right, unless the caller holds the right there. It returns the caller (`Principal`).

Something created by a PUT does not exist yet: the dependency lets the request through, and the
route checks the right on the team the new thing gets (`team_for_new`). Lists filter what they
show with `may`. `public` marks the few routes anyone may call (health, sign-in). Every route
declares one of the two: tests/unit/test_admin_access.py enumerates the routes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials

from admin.security import BEARER_AUTH, SESSION_AUTH, Authenticator
from msgbus.errors import Forbidden, InvalidConfig, InvalidStoredDocument, NotFound
from msgbus.models import Destination, SubscribePolicy, subscription_id
from msgbus.notify import Notifier
from msgbus.permissions import Right, check, check_somewhere, may, may_subscribe
from msgbus.store import MongoStore
from msgbus.store.requests import SubscriptionRequests
from msgbus.users import Principal


class On(StrEnum):
    BUS = "the bus"
    DESTINATION = "the destination {code}"
    SUBSCRIPTION = "the subscription {code}/{name}"
    APP = "the producer app {name}"
    TEAM = "the team {team}"
    CALLER = "the caller's own session and tokens"
    BODY = "what the body names (checked by the route)"
    REQUEST = "the destination of the subscription request {request_id}"
    MESSAGES = "the messages the route reads (checked by the route: admin/message_access.py)"


RULE_ATTRIBUTE = "msgbus_rule"  # on each rule's dependency: (right, On), or "public"


async def owning_team(store: MongoStore, on: On, path: dict[str, Any]) -> str | None:
    """The team that owns what the path names (None: the bus, or a thing not yet made)."""
    if on is On.REQUEST:  # an unknown request is a 404
        asked = await SubscriptionRequests(store).get(path["request_id"])
        return (await store.config.get_destination(asked.destination)).team
    try:
        if on is On.DESTINATION:
            return (await store.config.get_destination(path["code"])).team
        if on is On.SUBSCRIPTION:
            return await subscription_team(store, path["code"], path["name"])
        if on is On.APP:
            return (await store.producers.get_app(path["name"])).team
    except (NotFound, InvalidStoredDocument):  # not made yet, or to be replaced
        return None
    return str(path["team"]) if on is On.TEAM else None


async def subscription_team(store: MongoStore, code: str, name: str) -> str:
    """Its team (ConfigStore.subscription_team)."""
    return await store.config.subscription_team(code, name)


def needs(right: Right, on: On) -> Callable[..., Awaitable[Principal]]:
    async def rule(
            request: Request,
            _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER_AUTH)],
            _session: Annotated[str | None, Security(SESSION_AUTH)]) -> Principal:
        authenticator: Authenticator = request.app.state.authenticator
        who = await authenticator.principal(request)
        if on in (On.CALLER, On.MESSAGES):
            return who
        if on is On.BODY:
            check_somewhere(who, right)
            return who
        team = None
        if on is not On.BUS:
            team = await owning_team(request.app.state.parts.service.store, on,
                                          request.path_params)
            if team is None and on is not On.TEAM:
                return who  # not made yet: the route checks the team it will belong to
        check(who, right, team)
        return who

    setattr(rule, RULE_ATTRIBUTE, (right, on))
    return rule


async def _public() -> None:
    return None


setattr(_public, RULE_ATTRIBUTE, "public")
Public = Depends(_public)


def team_for_new(who: Principal, asked: str | None, fallback: str | None = None) -> str:
    """The team a new thing belongs to: the one asked for; else the caller's only team; else
    `fallback`; else a 422 that asks for it."""
    if asked:
        return asked
    if len(who.teams) == 1:
        return next(iter(who.teams))
    if fallback:
        return fallback
    teams = ", ".join(sorted(who.teams)) or "none"
    raise InvalidConfig(f"name the team that owns it (`team`): {who.name} is a member of "
                        f"{len(who.teams)} teams ({teams})", field="team")


def check_new(who: Principal, team: str) -> None:
    """The caller may make a thing that `team` owns."""
    check(who, Right.CHANGE, team)


async def tell_if_someone_else(store: MongoStore, notifier: Notifier, who: Principal,
                               kind: str, code: str, name: str) -> None:
    """The subscription's team hears of `kind` (msgbus/notify.py) when `who` is not in it
    (an admin, the bus's on-call, another team's token)."""
    team = await subscription_team(store, code, name)
    if team not in who.teams:
        notifier.emit(kind, subscription_id(code, name), {"by": who.name}, team)


def check_subscribe(who: Principal, team: str, destination: Destination) -> None:
    """A subscription of `team` may be made to `destination` (a bus admin may always)."""
    if is_bus_admin(who) or may_subscribe(team, destination):
        return
    how = ("on its team's approval: ask with POST /v1/destinations/{code}/subscription-"
           "requests" if destination.subscribers is SubscribePolicy.APPROVAL
           else f"by team {destination.team} and listed teams only")
    raise Forbidden(f"team {team} may not subscribe to {destination.code}: it takes "
                    f"subscriptions {how.format(code=destination.code)}", field="team")


def check_moved(who: Principal, current: str, asked: str | None) -> str:
    """The team a changed thing belongs to: a move to another team also needs the right to
    change what that team owns."""
    if asked and asked != current:
        check(who, Right.CHANGE, asked)
        return asked
    return current


def is_bus_admin(who: Principal) -> bool:
    return may(who, Right.ADMINISTER, None)


def sees(who: Principal, team: str) -> bool:
    return may(who, Right.READ, team)


async def check_on_subscriptions(store: MongoStore, who: Principal, right: Right,
                                 sub_ids: list[str]) -> None:
    """`right` on the team of each subscription (`code/name`) named."""
    for sub_id in sub_ids:
        code, _, name = sub_id.partition("/")
        check(who, right, await subscription_team(store, code, name))


async def may_on_subscriptions(store: MongoStore, who: Principal, right: Right,
                               sub_ids: list[str]) -> bool:
    try:
        await check_on_subscriptions(store, who, right, sub_ids)
    except Forbidden:
        return False
    return True


AsCaller = Annotated[Principal, Depends(needs(Right.SEE_CATALOGUE, On.CALLER))]
CreatesFromBody = Annotated[Principal, Depends(needs(Right.CHANGE, On.BODY))]
OperatesFromBody = Annotated[Principal, Depends(needs(Right.OPERATE, On.BODY))]
Catalogue = Annotated[Principal, Depends(needs(Right.SEE_CATALOGUE, On.BUS))]
ReadsBus = Annotated[Principal, Depends(needs(Right.READ, On.BUS))]
OperatesBus = Annotated[Principal, Depends(needs(Right.OPERATE, On.BUS))]
AdministersBus = Annotated[Principal, Depends(needs(Right.ADMINISTER, On.BUS))]
ReadsMessages = Annotated[Principal, Depends(needs(Right.READ_MESSAGES, On.MESSAGES))]
ReadsDestination = Annotated[Principal, Depends(needs(Right.READ, On.DESTINATION))]
ChangesDestination = Annotated[Principal, Depends(needs(Right.CHANGE, On.DESTINATION))]
OperatesDestination = Annotated[Principal, Depends(needs(Right.OPERATE, On.DESTINATION))]
ReadsSubscription = Annotated[Principal, Depends(needs(Right.READ, On.SUBSCRIPTION))]
OperatesSubscription = Annotated[Principal, Depends(needs(Right.OPERATE, On.SUBSCRIPTION))]
ChangesSubscription = Annotated[Principal, Depends(needs(Right.CHANGE, On.SUBSCRIPTION))]
ChangesApp = Annotated[Principal, Depends(needs(Right.CHANGE, On.APP))]
DecidesRequest = Annotated[Principal, Depends(needs(Right.CHANGE, On.REQUEST))]
ReadsTeam = Annotated[Principal, Depends(needs(Right.READ, On.TEAM))]
ManagesTeam = Annotated[Principal, Depends(needs(Right.MANAGE_MEMBERS, On.TEAM))]
