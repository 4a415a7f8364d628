"""Teams and their members: every signed-in user sees them; an admin makes and deletes teams;
a team's owners manage its members (msgbus/permissions.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field, HttpUrl

from admin.access import AdministersBus, Catalogue, ManagesTeam, ReadsTeam
from admin.deps import Service, Store, Users
from admin.params import GeneratedId
from admin.schemas import TeamTokenIn
from msgbus.errors import Conflict
from msgbus.models import utcnow
from msgbus.sealing import SecretKeys
from msgbus.store import MongoStore
from msgbus.store.notifications import NotificationStore
from msgbus.teams import TEAM_PATTERN, Member, Team, TeamRole
from msgbus.users import Role, team_token_holder

router = APIRouter()

TeamPath = Annotated[str, Path(pattern=TEAM_PATTERN, description="a team's name")]
MemberPath = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f/]+$",
                                 description="a user's name")]


class TeamIn(BaseModel):
    description: str = Field(default="", max_length=2000)
    members: list[Member] = Field(default_factory=list, max_length=10_000)
    notify_url: HttpUrl | Literal[""] | None = Field(
        default=None,
        description="the team's webhook for what happens to its subscriptions (msgbus/notify.py):"
                    " signed with `notify_secret`, made with the first URL; \"\": none; left "
                    "out: unchanged")


class MemberIn(BaseModel):
    role: TeamRole


def _view(team: Team, keys: SecretKeys | None = None) -> dict[str, Any]:
    """The team; its notification secret, opened with `keys`, only for those who manage it."""
    view = team.model_dump(mode="json", by_alias=False, exclude={"notify_secret"})
    if keys is not None:
        view["notify_secret"] = team.notify_secret and keys.open(team.notify_secret)
    return view


@router.get("/v1/teams")
async def list_teams(_: Catalogue, store: Store) -> list[dict[str, Any]]:
    return [_view(t) for t in (await store.teams.load()).items]


@router.get("/v1/teams/{team}")
async def get_team(team: TeamPath, _: Catalogue, store: Store) -> dict[str, Any]:
    return _view(await store.teams.get(team))


@router.put("/v1/teams/{team}")
async def put_team(team: TeamPath, body: TeamIn, who: ManagesTeam, store: Store,
                   users: Users, service: Service) -> dict[str, Any]:
    """Makes the team (an admin) or replaces its description and members (its owners)."""
    if body.notify_url:
        await service.check_egress(str(body.notify_url), field="notify_url")
    saved = await store.teams.save(team, body.description, body.members)
    if "notify_url" in body.model_fields_set:
        saved = await store.teams.set_notify_url(
            team, str(body.notify_url) if body.notify_url else None)
    await users.audit(who, "team.put", team, body.model_dump(mode="json"))
    return _view(saved, service.keys)


@router.get("/v1/teams/{team}/notifications")
async def team_notifications(team: TeamPath, _: ReadsTeam, store: Store) -> list[dict[str, Any]]:
    """What the team was told lately (msgbus/notify.py), newest first."""
    return await NotificationStore(store).recent(team)


@router.put("/v1/teams/{team}/members/{user}")
async def put_member(team: TeamPath, user: MemberPath, body: MemberIn, who: ManagesTeam,
                     store: Store, users: Users) -> dict[str, Any]:
    saved = await store.teams.set_member(team, user, body.role)
    await users.audit(who, "team.member_put", team, {"user": user, "role": body.role.value})
    return _view(saved)


@router.delete("/v1/teams/{team}/members/{user}")
async def delete_member(team: TeamPath, user: MemberPath, who: ManagesTeam, store: Store,
                        users: Users) -> dict[str, Any]:
    saved = await store.teams.set_member(team, user, None)
    await users.audit(who, "team.member_delete", team, {"user": user})
    return _view(saved)


@router.post("/v1/teams/{team}/tokens", status_code=201)
async def create_team_token(team: TeamPath, body: TeamTokenIn, who: ManagesTeam, store: Store,
                            users: Users) -> dict[str, Any]:
    """A token of the team itself, for its automation: it acts as a `role` of the team (and
    sees the catalogue), whoever comes and goes; it expires, and the team's owners list and
    revoke its tokens."""
    await store.teams.get(team)
    expires_at = utcnow() + timedelta(days=body.expires_in_days)
    token, doc = await users.create_token(team_token_holder(team), body.name, Role.VIEWER,
                                          expires_at, TeamRole(body.role))
    await users.audit(who, "team.token_create", team, {
        "token_id": doc["token_id"], "name": body.name, "role": body.role,
        "expires_at": expires_at.isoformat()})
    return {"token": token, "token_id": doc["token_id"], "team": team, "name": body.name,
            "role": body.role, "expires_at": expires_at, "note": "the token is shown only once"}


@router.get("/v1/teams/{team}/tokens")
async def list_team_tokens(team: TeamPath, _: ManagesTeam,
                           users: Users) -> list[dict[str, Any]]:
    return await users.list_tokens(team_token_holder(team))


@router.delete("/v1/teams/{team}/tokens/{token_id}", status_code=204)
async def revoke_team_token(team: TeamPath, token_id: GeneratedId, who: ManagesTeam,
                            users: Users) -> None:
    await users.revoke_token(token_id, team_token_holder(team))
    await users.audit(who, "team.token_revoke", team, {"token_id": token_id})


@router.delete("/v1/teams/{team}", status_code=204)
async def delete_team(team: TeamPath, who: AdministersBus, store: Store, users: Users) -> None:
    """Only a team that owns nothing: give its things to another team first."""
    await store.teams.get(team)
    owned = await _owned_by(store, team)
    if owned:
        raise Conflict(f"team {team} still owns {', '.join(owned[:10])}; give them to another "
                       "team first", field="team")
    await store.teams.delete(team)
    await users.audit(who, "team.delete", team)


async def _owned_by(store: MongoStore, team: str) -> list[str]:
    destinations = await store.config.list_destinations()
    teams = {d.code: d.team for d in destinations}
    owned = [f"destination {d.code}" for d in destinations if d.team == team]
    owned += [f"subscription {s.id}" for s in await store.config.list_subscriptions()
              if s.owning_team(teams) == team]
    owned += [f"producer app {a.name}" for a in (await store.producers.load_apps()).items
              if a.team == team]
    return owned
