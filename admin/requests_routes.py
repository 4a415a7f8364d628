"""Subscription requests: a destination that takes other teams' subscriptions on its team's
approval (`subscribers: approval`) gets a request instead (msgbus/store/requests.py), which a
maintainer of its team accepts (the subscription is made, owned by the team that asked) or
declines. Everyone involved sees them: the destination's team and the team that asked."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from admin.access import Catalogue, CreatesFromBody, DecidesRequest, check_new, team_for_new
from admin.deps import Deletions, Requests, Service
from admin.params import DestinationCode, GeneratedId
from admin.removal import refuse_while_deleting
from admin.schemas import SubscriptionIn
from msgbus.errors import Conflict, InvalidConfig
from msgbus.models import NAME_PATTERN, subscription_id
from msgbus.permissions import Right, may, may_subscribe
from msgbus.store.requests import RequestState, SubscriptionRequest
from msgbus.teams import TeamName

router = APIRouter()


class RequestIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description="the subscription's name")
    team: TeamName | None = Field(default=None, description="the team that asks (default: "
                                                            "the caller's only team)")
    settings: SubscriptionIn
    note: str = Field(default="", max_length=2000, description="why, for the team that decides")


class DecisionIn(BaseModel):
    reason: str = Field(default="", max_length=2000)


def _view(asked: SubscriptionRequest) -> dict[str, Any]:
    return asked.model_dump(mode="json", by_alias=False)


@router.post("/v1/destinations/{code}/subscription-requests", status_code=201)
async def request_subscription(code: DestinationCode, body: RequestIn, who: CreatesFromBody,
                               service: Service, requests: Requests) -> dict[str, Any]:
    destination = await service.store.config.get_destination(code)
    team = team_for_new(who, body.team)
    check_new(who, team)
    await service.check_egress(str(body.settings.url), field="settings.url")
    if body.settings.auth is not None:
        # the deciding team would read them: credentials are set by the owning team once
        # the subscription exists
        raise InvalidConfig("a subscription request carries no auth: once accepted, the "
                            f"subscription's team sets it (PUT /v1/destinations/{code}/"
                            f"subscriptions/{body.name})", field="settings.auth")
    if may_subscribe(team, destination):
        raise Conflict(f"team {team} needs no approval to subscribe to {code}: PUT "
                       f"/v1/destinations/{code}/subscriptions/{body.name}", field="team")
    asked = await requests.create(code, body.name, team,
                                  body.settings.model_dump(mode="json", exclude={"team"}),
                                  body.note, who.name)
    await service.users.audit(who, "subscription_request.create", code,
                              {"request_id": asked.request_id, "name": body.name,
                               "team": team})
    service.notifier.emit("subscription_request.created", f"{code}/{body.name}",
                          {"request_id": asked.request_id, "team": team, "note": body.note},
                          destination.team)
    return _view(asked)


@router.get("/v1/subscription-requests")
async def list_requests(who: Catalogue, service: Service, requests: Requests,
                        state: RequestState | None = None,
                        limit: Annotated[int, Query(ge=1, le=500)] = 100) -> list[dict[str, Any]]:
    """The newest requests the caller's teams asked for or decide on."""
    teams = {d.code: d.team for d in await service.store.config.list_destinations()}
    return [_view(r) for r in await requests.recent(limit, state)
            if may(who, Right.READ, r.team) or may(who, Right.READ, teams.get(r.destination))]


@router.post("/v1/subscription-requests/{request_id}/accept")
async def accept_request(request_id: GeneratedId, who: DecidesRequest, service: Service,
                         requests: Requests, deletions: Deletions,
                         body: DecisionIn | None = None) -> dict[str, Any]:
    """The subscription is made, owned by the team that asked."""
    asked = await requests.get(request_id)
    await refuse_while_deleting(deletions, asked.destination, asked.name)
    decided = await requests.decide(request_id, RequestState.ACCEPTED, who.name,
                                    (body or DecisionIn()).reason)
    try:
        sub = await service.create_subscription(asked.destination, asked.name, asked.team,
                                                asked.settings)
    except Exception:
        await requests.reopen(request_id)  # still to be decided
        raise
    await service.users.audit(who, "subscription_request.accept",
                              subscription_id(asked.destination, asked.name),
                              {"request_id": request_id, "team": asked.team})
    return _view(decided) | {"subscription": sub.shown()}


@router.post("/v1/subscription-requests/{request_id}/decline")
async def decline_request(request_id: GeneratedId, who: DecidesRequest, service: Service,
                          requests: Requests, body: DecisionIn | None = None) -> dict[str, Any]:
    decided = await requests.decide(request_id, RequestState.DECLINED, who.name,
                                    (body or DecisionIn()).reason)
    await service.users.audit(who, "subscription_request.decline", decided.destination,
                              {"request_id": request_id, "team": decided.team})
    return _view(decided)
