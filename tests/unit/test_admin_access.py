"""Every route of the admin API declares its rule (admin/access.py): the right it needs and on
what, or that it is public; the rules are the table docs/operations.md shows; a missing right
is a 403 that names it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import SecretStr

from admin.access import RULE_ATTRIBUTE
from admin.app import create_app
from admin.service import AdminService
from msgbus.errors import Forbidden
from msgbus.permissions import Right, check, may, rules_table
from msgbus.settings import AdminSettings
from msgbus.teams import TeamRole
from msgbus.users import Principal, Role

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
PROBES = {"/metrics", "/ready"}  # every service's own (msgbus/http.py): never need a caller


def _rules(dependant: Dependant) -> list[object]:
    found = [getattr(d.call, RULE_ATTRIBUTE) for d in dependant.dependencies
             if d.call is not None and hasattr(d.call, RULE_ATTRIBUTE)]
    return found + [r for d in dependant.dependencies for r in _rules(d)]


def test_every_api_route_declares_exactly_one_rule() -> None:
    app = create_app(AdminService(AdminSettings(token=SecretStr("t" * 32))))
    undeclared, several = [], []
    for route in app.routes:
        if (not isinstance(route, APIRoute) or route.path.startswith("/ui")
                or route.path in PROBES | {"/"}):
            continue
        rules = _rules(route.dependant)
        name = f"{sorted(route.methods)} {route.path}"
        if not rules:
            undeclared.append(name)
        elif len(rules) > 1:
            several.append(f"{name}: {rules}")
    assert not undeclared, f"routes without a rule: {undeclared}"
    assert not several, f"routes with more than one rule: {several}"


def test_the_documented_table_is_the_rule_set() -> None:
    assert rules_table() in DOCS.read_text(), "docs/operations.md: paste rules_table() again"


def member(team: str, role: TeamRole, bus_role: Role = Role.VIEWER) -> Principal:
    return Principal(name="ana", role=bus_role, via="session", teams={team: role})


@pytest.mark.parametrize(("role", "right", "allowed"), [
    (TeamRole.VIEWER, Right.READ, True), (TeamRole.VIEWER, Right.OPERATE, False),
    (TeamRole.MAINTAINER, Right.OPERATE, True), (TeamRole.MAINTAINER, Right.CHANGE, True),
    (TeamRole.MAINTAINER, Right.MANAGE_MEMBERS, False), (TeamRole.OWNER, Right.MANAGE_MEMBERS,
                                                         True)])
def test_a_member_holds_the_rights_of_their_role_on_their_team_only(
        role: TeamRole, right: Right, allowed: bool) -> None:
    who = member("orders", role)
    assert may(who, right, "orders") is allowed
    assert not may(who, right, "payments")  # nothing on another team's things
    assert not may(who, Right.ADMINISTER, None)


def test_bus_wide_roles() -> None:
    operator = Principal(name="oncall", role=Role.OPERATOR, via="session")
    admin = Principal(name="root", role=Role.ADMIN, via="session")
    viewer = Principal(name="new", role=Role.VIEWER, via="session")
    assert may(operator, Right.OPERATE, "payments") and not may(operator, Right.CHANGE, "payments")
    assert all(may(admin, right, "payments") for right in Right if right != Right.READ_MESSAGES)
    assert not may(admin, Right.READ_MESSAGES, "payments")  # unless the glass is broken
    assert may(viewer, Right.SEE_CATALOGUE, None) and not may(viewer, Right.READ, "payments")


def test_a_missing_right_is_a_403_that_names_it() -> None:
    with pytest.raises(Forbidden) as refused:
        check(member("orders", TeamRole.VIEWER), Right.OPERATE, "orders")
    assert refused.value.message == (
        "ana may not operate what team orders owns: that needs a maintainer of orders (or the "
        "bus-wide role operator); ana is a viewer of team orders")
