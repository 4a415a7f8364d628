"""The web UI: server-rendered pages (Jinja2) over the same store as the management API.

Pages read; actions (pause, resume, re-drive, replays) are buttons whose few lines of JS
(`static/ui.js`) call the JSON API with the session's CSRF token, so every rule and audit entry
of the API applies to the UI too. Nothing is loaded from elsewhere at run time.

Every list is index-backed queries with a limit; pages go back and forth with keyset
cursors, never with counts or skips. A page asked for without a valid session goes to the
login page (`UiUser`, admin/deps.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from admin.access import subscription_team
from admin.auth_form import auth_fields
from admin.deps import (
    LoginRequired,
    Parts,
    Replays,
    Requests,
    Service,
    Store,
    UiUser,
    Users,
    parts_of,
    to_login,
)
from admin.destination_view import broker_switches, destination_view, schema_summary
from admin.message_list import SCAN_CAP, Cursor, ListQuery, Page
from admin.oidc import FLOW_COOKIE, FLOW_TTL_S
from admin.operations import TRANSITIONS
from admin.pushers import pushers_of
from admin.security import SESSION_COOKIE, client_address
from admin.subscribe_offer import subscribe_offer
from admin.subscription_health import RANGES, subscription_health
from admin.templating import HERE, templates
from msgbus.errors import Forbidden, InvalidStoredDocument, MsgbusError, NotFound, Unauthorized
from msgbus.http import include_routes, retry_after
from msgbus.models import BrokerKind, CircuitPolicy, DeliveryStatus, RetryPolicy, subscription_id
from msgbus.permissions import Right, check, holds_somewhere, may
from msgbus.store.notifications import NotificationStore
from msgbus.store.schemas import SchemaStore
from msgbus.throttle import TooManyAttempts
from msgbus.users import Principal, Role

PAGE_SIZE = 50
# which buttons a replay in each state shows
REPLAY_ACTIONS: dict[str, list[str]] = {}
for _action, (_, _sources) in TRANSITIONS.items():
    for _state in _sources:
        REPLAY_ACTIONS.setdefault(_state.value, []).append(_action)

router = APIRouter(include_in_schema=False)


def add_ui(app: FastAPI) -> None:
    """The UI's static files and pages, and its way to the login page."""
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.add_exception_handler(LoginRequired, to_login)
    include_routes(app, router)


def _utc(value: str | None) -> datetime | None:
    """A datetime-local form value, read as UTC."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def page(request: Request, template: str, who: Principal, **context: Any) -> HTMLResponse:
    sessions = parts_of(request).service.auth.sessions
    csrf = sessions.csrf_token(who.session_id) if who.session_id else ""
    return templates.TemplateResponse(request, template, {
        "who": who, "csrf_token": csrf,
        "can_operate": who.role.allows(Role.OPERATOR),
        "can_admin": who.role.allows(Role.ADMIN),
        # what the buttons show follows the rules (msgbus/permissions.py): may("operate", team)
        "may": lambda right, team=None: may(who, Right(right), team),
        "makes": holds_somewhere(who, Right.CHANGE), **context})


@router.get("/")
async def home() -> RedirectResponse:
    return RedirectResponse("/ui/dashboard", status_code=303)


@router.get("/ui/dashboard", response_model=None)
async def dashboard_page(request: Request, who: UiUser, parts: Parts) -> Response:
    """The figures, and the services as each sees MongoDB; through a MongoDB outage too (the
    figures last built, a banner, the services the admin last read): within seconds, never a
    503 (admin/outage.py)."""
    data, services = await asyncio.gather(parts.dashboard.current(),
                                          parts.service.services.status())
    return page(request, "dashboard.html", who, page="Dashboard", data=data,
                services=services, mongo=services["mongo"])


@router.get("/ui/login", response_model=None)
async def login_form(request: Request, service: Service) -> Response:
    return _login_page(request, service)


def _login_page(request: Request, service: Service, error: str | None = None,
                status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return templates.TemplateResponse(
        request, "login.html",
        {"who": None, "error": error, "company": service.company is not None},
        status_code=status_code, headers=headers)


@router.get("/ui/oidc/start", response_model=None)
async def company_sign_in(request: Request, service: Service) -> Response:
    """To the company's identity provider (admin/oidc.py)."""
    if service.company is None:
        return _login_page(request, service, "company sign-in is not set up here", 404)
    url, flow = await service.company.start()
    response = RedirectResponse(url, status_code=303)
    response.set_cookie(FLOW_COOKIE, flow, max_age=FLOW_TTL_S, httponly=True, samesite="lax",
                        secure=request.url.scheme == "https", path="/ui/oidc")
    return response


@router.get("/ui/oidc/callback", response_model=None)
async def company_signed_in(request: Request, service: Service, code: str = "",
                            state: str = "", error: str = "") -> Response:
    """Back from the identity provider: a session, as a password's gives."""
    if service.company is None:
        return _login_page(request, service, "company sign-in is not set up here", 404)
    if error or not code:
        why = error or "no code"
        return _login_page(request, service,
                           f"the company sign-in did not succeed ({why})", 401)
    try:
        cookie, session_id, user = await service.company.finish(
            code, state, request.cookies.get(FLOW_COOKIE))
    except Unauthorized as refused:
        return _login_page(request, service, refused.message, 401)
    await service.users.audit(Principal(user["_id"], Role(user["role"]), "oidc", session_id),
                              "session.login", user["_id"])
    return _signed_in(request, service, cookie)


def _signed_in(request: Request, service: Service, cookie: str) -> Response:
    response = RedirectResponse("/ui/dashboard", status_code=303)
    response.set_cookie(SESSION_COOKIE, cookie, max_age=int(service.auth.sessions.ttl_s),
                        httponly=True, samesite="lax", secure=request.url.scheme == "https")
    response.delete_cookie(FLOW_COOKIE, path="/ui/oidc")
    return response


@router.post("/ui/login", response_model=None)
async def login(request: Request, service: Service, username: str = Form(...),
                password: str = Form(...)) -> Response:
    users, sessions = service.users, service.auth.sessions
    try:
        user = await service.signins.user(username, password, client_address(request))
    except (Unauthorized, TooManyAttempts) as refused:
        return _login_page(request, service, refused.message, refused.status_code,
                           retry_after(refused))
    cookie, session_id = sessions.issue(username)
    await users.audit(Principal(username, Role(user["role"]), "session", session_id),
                      "session.login", username)
    response = RedirectResponse("/ui/dashboard", status_code=303)
    response.set_cookie(SESSION_COOKIE, cookie, max_age=int(sessions.ttl_s),
                        httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


@router.post("/ui/logout")
async def logout() -> Response:
    response = Response(b"{}", media_type="application/json")
    response.delete_cookie(SESSION_COOKIE)
    return response


@router.get("/ui/destinations", response_model=None)
async def destinations_page(request: Request, who: UiUser, store: Store) -> Response:
    subs: dict[str, list[Any]] = {}
    for sub in await store.config.list_subscriptions():
        subs.setdefault(sub.destination, []).append(sub)
    invalid = await store.invalid.in_every_collection()
    destinations = await store.config.list_destinations()
    return page(request, "destinations.html", who, page="Destinations",
                destinations=destinations, subscriptions=subs, invalid=invalid,
                offers={d.code: subscribe_offer(who, d) for d in destinations},
                schema_versions=await SchemaStore(store).latest_versions())


@router.get("/ui/destinations/{code}", response_model=None)
async def destination_page(request: Request, code: str, who: UiUser, store: Store,
                           users: Users, parts: Parts) -> Response:
    """A destination: broker and switch history, its subscriptions' health, schema versions,
    messages per hour; who may subscribe and the user's way to."""
    destination = await store.config.get_destination(code)
    view = destination_view(destination, await broker_switches(users, code),
                            await parts.dashboard.get(), await SchemaStore(store).versions(code))
    return page(request, "destination.html", who, page="Destinations", view=view,
                d=destination, schema_summary=schema_summary,
                offer=subscribe_offer(who, destination))


@router.get("/ui/messages", response_model=None)
async def messages_page(request: Request, who: UiUser, service: Service, message_id: str = "",
                        biz_id: str = "", destination: str = "", subscription: str = "",
                        status: str = "", since: str = "", until: str = "",
                        before: str = "", after: str = "") -> Response:
    """The message list (admin/message_list.py): `before` pages back (older), `after` forward;
    only the messages of destinations the user reads (admin/message_access.py)."""
    if message_id.strip():
        return RedirectResponse(f"/ui/messages/{message_id.strip()}", status_code=303)
    form = {"biz_id": biz_id, "destination": destination, "subscription": subscription,
            "status": status, "since": since, "until": until}
    error, found = None, Page([], None, None)
    try:
        query = ListQuery(biz_id=biz_id.strip() or None,
                          destination=destination.strip() or None,
                          subscription=subscription.strip() or None,
                          state=DeliveryStatus(status) if status else None,
                          since=_utc(since), until=_utc(until))
        cursor = (Cursor.decode(after, "after") if after
                  else Cursor.decode(before, "before") if before else None)
        found = await service.message_page(who, query, cursor, older=not after,
                                           limit=PAGE_SIZE)
    except (ValueError, MsgbusError) as exc:
        error = getattr(exc, "message", None) or str(exc)
    query_string = {k: v for k, v in form.items() if v}
    links = {name: "/ui/messages?" + urlencode({**query_string, param: c.encode()})
             for name, param, c in (("newer", "after", found.newer),
                                    ("older", "before", found.older)) if c is not None}
    return page(request, "messages.html", who, page="Messages", q=form,
                messages=found.messages, next_url=links.get("older"),
                prev_url=links.get("newer"), scanned_out=found.scanned_out, error=error,
                statuses=[s.value for s in DeliveryStatus], scan_cap=SCAN_CAP)


@router.get("/ui/messages/{message_id}", response_model=None)
async def message_page(request: Request, message_id: str, who: UiUser,
                       service: Service) -> Response:
    try:
        timeline = await service.message_timeline(message_id, who)
    except (NotFound, Forbidden) as exc:
        return page(request, "messages.html", who, page="Messages", q={},
                    messages=[], next_url=None, prev_url=None, error=exc.message,
                    statuses=[s.value for s in DeliveryStatus])
    message = timeline["message"]
    body = message.get("body", "")
    with contextlib.suppress(ValueError):  # not JSON: shown as it is
        body = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    return page(request, "message.html", who, page="Messages", message=message,
                deliveries=timeline["deliveries"], body=body,
                headers=json.dumps(message.get("headers") or {}, indent=2))


@router.get("/ui/parked/{code}/{name}", response_model=None)
async def parked_page(request: Request, code: str, name: str, who: UiUser,
                      parts: Parts) -> Response:
    check(who, Right.READ, await subscription_team(parts.service.store, code, name))
    sub_id = subscription_id(code, name)
    return page(request, "parked.html", who, page="Destinations", sub_id=sub_id,
                code=code, name=name, parked=await parts.ui_claims.parked(sub_id, PAGE_SIZE))


@router.get("/ui/replays", response_model=None)
async def replays_page(request: Request, who: UiUser, replays: Replays) -> Response:
    check(who, Right.READ, None)  # every team's replays: the bus's operators and admins
    jobs = [{"replay_id": j["_id"], **j} for j in await replays.recent(PAGE_SIZE)]
    return page(request, "replays.html", who, page="Replays", jobs=jobs,
                actions=REPLAY_ACTIONS,
                refresh=any(j["state"] == "running" for j in jobs))


@router.get("/ui/subscriptions/{code}/{name}", response_model=None)
async def subscription_page(request: Request, code: str, name: str, who: UiUser,
                            store: Store, range: str = "hour") -> Response:
    """How a subscription is doing (charts over `range`: hour, day or week; its newest
    failures); edit (or, with name `new`, create) it; act on it; how to verify pushes."""
    destination = await store.config.get_destination(code)
    team = destination.team
    if name != "new":  # the form for a new one: the API decides who may make it
        team = await subscription_team(store, code, name)
        check(who, Right.READ, team)
    sub, invalid = None, None
    if name != "new":
        try:
            sub = await store.config.get_subscription(subscription_id(code, name))
        except InvalidStoredDocument as exc:  # the form replaces it
            invalid = exc.message
    pushers = None if sub is None else await pushers_of(
        store, sub.id, sub.dispatchers, brokered=destination.broker is not BrokerKind.DIRECT)
    health = await subscription_health(store, sub.id, range) if sub is not None else None
    filters = [f.model_dump() for f in sub.filters] if sub is not None else []
    return page(request, "subscription.html", who, page="Destinations", code=code, team=team,
                name=None if sub is None and invalid is None else name, sub=sub,
                invalid=invalid, pushers=pushers, health=health, ranges=list(RANGES),
                policy=sub.retry_policy if sub is not None else RetryPolicy(),
                circuit=sub.circuit if sub is not None else CircuitPolicy(), filters=filters,
                auth=auth_fields(sub.auth if sub is not None else None))


@router.get("/ui/teams", response_model=None)
async def teams_page(request: Request, who: UiUser, store: Store) -> Response:
    return page(request, "teams.html", who, page="Teams",
                teams=(await store.teams.load()).items)


@router.get("/ui/teams/{team}", response_model=None)
async def team_page(request: Request, team: str, who: UiUser, store: Store,
                    requests: Requests) -> Response:
    """A team's home: what it owns and how it does, its members, the subscription requests
    it decides or made, what it was told lately."""
    check(who, Right.READ, team)
    found = await store.teams.get(team)
    every_destination = await store.config.list_destinations()
    destinations = [d for d in every_destination if d.team == team]
    teams_of = {d.code: d.team for d in every_destination}
    subscriptions = [s for s in await store.config.list_subscriptions()
                     if s.owning_team(teams_of) == team]
    apps = [a for a in (await store.producers.load_apps()).items if a.team == team]
    asked = [r for r in await requests.recent(50)
             if r.team == team or teams_of.get(r.destination) == team]
    decides = may(who, Right.CHANGE, team)  # on the requests to subscribe to its destinations
    requests_shown = [r.model_dump(by_alias=False)
                      | {"decides": decides and teams_of.get(r.destination) == team}
                      for r in asked]
    return page(request, "team.html", who, page="Teams", team=found, role=who.teams.get(team),
                destinations=destinations, subscriptions=subscriptions, apps=apps,
                requests=requests_shown,
                notifications=await NotificationStore(store).recent(team, 20))


@router.get("/ui/audit", response_model=None)
async def audit_page(request: Request, who: UiUser, users: Users,
                     before: str = "") -> Response:
    check(who, Right.READ, None)  # every team's changes: the bus's operators and admins
    entries = await users.audit_log(PAGE_SIZE, _utc(before))
    next_url = (f"/ui/audit?before={entries[-1]['at'].isoformat()}"
                if len(entries) == PAGE_SIZE else None)
    return page(request, "audit.html", who, page="Audit", entries=entries,
                next_url=next_url)
