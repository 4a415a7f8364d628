"""The catalogue's subscribe form follows the rules (admin/subscribe_offer.py): who may
subscribe in words, and per team of the user subscribe at once, ask, or neither and why."""

from __future__ import annotations

from admin.subscribe_offer import SubscribeOffer, policy_in_words, subscribe_offer
from msgbus.models import Destination, SubscribePolicy
from msgbus.teams import TeamRole
from msgbus.users import Principal, Role

M, V = TeamRole.MAINTAINER, TeamRole.VIEWER


def _user(role: Role = Role.VIEWER, **teams: TeamRole) -> Principal:
    return Principal("ann", role, "session", teams=teams)


def _destination(policy: SubscribePolicy, *listed: str) -> Destination:
    return Destination(code="payments", team="b", subscribers=policy,
                       subscriber_teams=list(listed))


def test_an_open_destination_takes_every_team_the_user_changes_for() -> None:
    offer = subscribe_offer(_user(c=M, a=M, v=V), _destination(SubscribePolicy.ANY))
    assert offer == SubscribeOffer("any team may subscribe", direct=["a", "c"])


def test_listed_teams_subscribe_and_the_others_are_told_why_not() -> None:
    listed = _destination(SubscribePolicy.TEAMS, "a")
    assert policy_in_words(listed) == "team b and a may subscribe"
    assert subscribe_offer(_user(a=M, c=M), listed).direct == ["a"]
    refused = subscribe_offer(_user(c=M), listed)
    assert (refused.direct, refused.ask) == ([], [])
    assert refused.why_not == "none of your teams (c) may subscribe to it"
    assert policy_in_words(_destination(SubscribePolicy.TEAMS)) == "only team b may subscribe"


def test_on_approval_other_teams_ask_and_the_owner_team_subscribes() -> None:
    approval = _destination(SubscribePolicy.APPROVAL)
    offer = subscribe_offer(_user(a=M, b=M), approval)
    assert (offer.direct, offer.ask) == (["b"], ["a"])
    assert offer.policy == "team b subscribes; other teams ask and team b decides"
    # a bus admin may always subscribe (admin/access.py: check_subscribe)
    assert subscribe_offer(_user(Role.ADMIN, a=M), approval).direct == ["a"]


def test_without_a_team_that_changes_there_is_no_form() -> None:
    approval = _destination(SubscribePolicy.APPROVAL)
    assert "no team" in subscribe_offer(_user(), approval).why_not
    assert "+ subscription" in subscribe_offer(_user(Role.ADMIN), approval).why_not
    viewer = subscribe_offer(_user(Role.OPERATOR, a=V), approval)
    assert (viewer.direct, viewer.ask) == ([], [])
    assert viewer.why_not.startswith("you only view in your teams")
