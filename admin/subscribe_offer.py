"""What the catalogue offers a user on each destination: who may subscribe (its policy in
words) and, for the user's teams, how they subscribe: directly (PUT .../subscriptions/{name},
owned by the team), by asking the destination's team (a subscription request), or not at all
and why. The API decides again on every call (admin/access.py: check_subscribe); this only
chooses the form the page shows."""

from __future__ import annotations

from dataclasses import dataclass, field

from admin.access import is_bus_admin
from msgbus.models import Destination, SubscribePolicy
from msgbus.permissions import Right, may, may_subscribe
from msgbus.users import Principal


@dataclass(frozen=True)
class SubscribeOffer:
    policy: str  # who may subscribe, in words
    direct: list[str] = field(default_factory=list)  # the user's teams that subscribe at once
    ask: list[str] = field(default_factory=list)  # those that ask the destination's team
    why_not: str = ""  # neither: why, in one line


def policy_in_words(destination: Destination) -> str:
    owner = f"team {destination.team}"
    if destination.subscribers is SubscribePolicy.ANY:
        return "any team may subscribe"
    if destination.subscribers is SubscribePolicy.APPROVAL:
        return f"{owner} subscribes; other teams ask and {owner} decides"
    listed = ", ".join(destination.subscriber_teams)
    return f"{owner} and {listed} may subscribe" if listed else f"only {owner} may subscribe"


def subscribe_offer(who: Principal, destination: Destination) -> SubscribeOffer:
    """How each team `who` may act for (holds CHANGE in) subscribes to `destination`."""
    policy = policy_in_words(destination)
    teams = [t for t in sorted(who.teams) if may(who, Right.CHANGE, t)]
    direct = [t for t in teams if is_bus_admin(who) or may_subscribe(t, destination)]
    ask = ([t for t in teams if t not in direct]
           if destination.subscribers is SubscribePolicy.APPROVAL else [])
    if direct or ask:
        return SubscribeOffer(policy, direct, ask)
    if not who.teams and is_bus_admin(who):
        why = "you are in no team: name the team on the + subscription form"
    elif not who.teams:
        why = "you are in no team, and a subscription belongs to a team"
    elif not teams:
        why = ("you only view in your teams: subscribing needs a maintainer or owner of one "
               "(" + ", ".join(sorted(who.teams)) + ")")
    else:
        why = "none of your teams (" + ", ".join(teams) + ") may subscribe to it"
    return SubscribeOffer(policy, why_not=why)
