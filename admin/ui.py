"""The web UI: server-rendered pages (Jinja2) over the same store as the management API.

Pages read; actions (pause, resume, re-drive, replays) are buttons whose few lines of JS
(`static/ui.js`) call the JSON API with the session's CSRF token, so every rule and audit entry
of the API applies to the UI too. Nothing is loaded from elsewhere at run time.

Every list is one index-backed query with a limit; pages go back in time with a `before`
cursor, never with counts or skips. A page asked for without a valid session goes to the
login page (`UiUser`, admin/deps.py).
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from admin.deps import (
    LoginRequired,
    Parts,
    Replays,
    Service,
    Store,
    UiUser,
    Users,
    parts_of,
    to_login,
)
from admin.operations import TRANSITIONS
from admin.pushers import pushers_of
from admin.security import SESSION_COOKIE
from msgbus.errors import InvalidStoredDocument, MsgbusError, NotFound
from msgbus.http import include_routes
from msgbus.models import CircuitPolicy, DeliveryStatus, RetryPolicy, subscription_id, utcnow
from msgbus.store import MongoStore
from msgbus.store.schemas import SchemaStore
from msgbus.users import Principal, Role, check_password

HERE = Path(__file__).parent
PAGE_SIZE = 50
# A search looks back this far first, and further only while it has less than a page: the
# newest page is then a short index range, however many messages are stored.
SEARCH_WINDOWS: tuple[timedelta | None, ...] = (
    timedelta(hours=1), timedelta(days=1), timedelta(days=7), timedelta(days=31), None)
# which buttons a replay in each state shows
REPLAY_ACTIONS: dict[str, list[str]] = {}
for _action, (_, _sources) in TRANSITIONS.items():
    for _state in _sources:
        REPLAY_ACTIONS.setdefault(_state.value, []).append(_action)

templates = Jinja2Templates(directory=HERE / "templates")
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
        "can_admin": who.role.allows(Role.ADMIN), **context})


@router.get("/")
async def home() -> RedirectResponse:
    return RedirectResponse("/ui/dashboard", status_code=303)


@router.get("/ui/dashboard", response_model=None)
async def dashboard_page(request: Request, who: UiUser, parts: Parts) -> Response:
    return page(request, "dashboard.html", who, page="Dashboard",
                data=await parts.dashboard.get())


@router.get("/ui/login", response_model=None)
async def login_form(request: Request) -> Response:
    return templates.TemplateResponse(request, "login.html", {"who": None})


@router.post("/ui/login", response_model=None)
async def login(request: Request, service: Service, username: str = Form(...),
                password: str = Form(...)) -> Response:
    users, sessions = service.users, service.auth.sessions
    user = await users.find_user(username)
    if (user is None or user.get("disabled")
            or not check_password(password, user["password_hash"])):
        return templates.TemplateResponse(
            request, "login.html", {"who": None, "error": "wrong user name or password"},
            status_code=401)
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
    for sub in await store.list_subscriptions():
        subs.setdefault(sub.destination, []).append(sub)
    invalid = await store.all_invalid_documents()
    return page(request, "destinations.html", who, page="Destinations",
                destinations=await store.list_destinations(), subscriptions=subs,
                invalid=invalid, schema_versions=await SchemaStore(store).latest_versions())


@router.get("/ui/messages", response_model=None)
async def messages_page(request: Request, who: UiUser, store: Store, message_id: str = "",
                        biz_id: str = "", destination: str = "", subscription: str = "",
                        status: str = "", since: str = "", until: str = "",
                        before: str = "") -> Response:
    if message_id.strip():
        return RedirectResponse(f"/ui/messages/{message_id.strip()}", status_code=303)
    query = {"biz_id": biz_id, "destination": destination, "subscription": subscription,
             "status": status, "since": since, "until": until}
    error, found = None, []
    try:
        newest = min(filter(None, [_utc(until), _utc(before)]), default=None) or utcnow()
        oldest = _utc(since)
        for window in SEARCH_WINDOWS:
            start = newest - window if window is not None else None
            if oldest is not None and (start is None or start < oldest):
                start = oldest
            found = await _search(store, query, start, newest)
            if len(found) == PAGE_SIZE or start == oldest:
                break
    except (ValueError, MsgbusError) as exc:
        error = str(exc)
    next_url = None
    if len(found) == PAGE_SIZE:
        cursor = found[-1]["created_at"].isoformat()
        next_url = "/ui/messages?" + urlencode({**query, "before": cursor})
    return page(request, "messages.html", who, page="Messages", q=query,
                messages=found, next_url=next_url, error=error,
                statuses=[s.value for s in DeliveryStatus])


async def _search(store: MongoStore, query: dict[str, str], since: datetime | None,
                  until: datetime) -> list[dict[str, Any]]:
    """A page of the messages `query` (the search form's fields) finds in [since, until)."""
    if query["subscription"]:
        return await _by_delivery(store, query["subscription"], query["status"], since, until)
    return await store.find_messages(
        biz_id=query["biz_id"] or None, destination=query["destination"] or None,
        since=since, until=until, limit=PAGE_SIZE)


async def _by_delivery(store: MongoStore, sub_id: str, status: str, since: datetime | None,
                       until: datetime | None) -> list[dict[str, Any]]:
    """Messages of one subscription (optionally in one delivery state), newest first:
    the (subscription, status, created_at) index of deliveries, then the messages by id."""
    query: dict[str, Any] = {"subscription": sub_id}
    if status:
        query["status"] = DeliveryStatus(status).value
    window = {k: v for k, v in (("$gte", since), ("$lt", until)) if v is not None}
    if window:
        query["created_at"] = window
    cursor = store.deliveries.find(query, {"message_id": 1}).sort(
        "created_at", -1).limit(PAGE_SIZE)
    ids = [d["message_id"] async for d in cursor]
    if status == DeliveryStatus.PENDING:  # those without a state yet, newest first
        ids += await store.pending_message_ids(sub_id, PAGE_SIZE)
    found = {m["_id"]: m async for m in store.messages.find({"_id": {"$in": ids}})}
    messages = [found[i] for i in ids if i in found]
    if status == DeliveryStatus.PENDING:
        messages = [m for m in messages if (since is None or m["created_at"] >= since)
                    and (until is None or m["created_at"] < until)]
        messages.sort(key=lambda m: m["created_at"], reverse=True)
    return messages[:PAGE_SIZE]


@router.get("/ui/messages/{message_id}", response_model=None)
async def message_page(request: Request, message_id: str, who: UiUser,
                       service: Service) -> Response:
    try:
        timeline = await service.message_timeline(message_id)
    except NotFound as exc:
        return page(request, "messages.html", who, page="Messages", q={},
                    messages=[], next_url=None, error=exc.message,
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
    sub_id = subscription_id(code, name)
    return page(request, "parked.html", who, page="Destinations", sub_id=sub_id,
                code=code, name=name, parked=await parts.ui_claims.parked(sub_id, PAGE_SIZE))


@router.get("/ui/replays", response_model=None)
async def replays_page(request: Request, who: UiUser, replays: Replays) -> Response:
    jobs = [{"replay_id": j["_id"], **j} for j in await replays.recent(PAGE_SIZE)]
    return page(request, "replays.html", who, page="Replays", jobs=jobs,
                actions=REPLAY_ACTIONS,
                refresh=any(j["state"] == "running" for j in jobs))


@router.get("/ui/subscriptions/{code}/{name}", response_model=None)
async def subscription_page(request: Request, code: str, name: str, who: UiUser,
                            store: Store) -> Response:
    """Edit (or, with name `new`, create) a subscription; test it; how to verify pushes."""
    await store.get_destination(code)
    sub, invalid = None, None
    if name != "new":
        try:
            sub = await store.get_subscription(subscription_id(code, name))
        except InvalidStoredDocument as exc:  # the form replaces it
            invalid = exc.message
    pushers = await pushers_of(store, sub.id) if sub is not None else None
    policy = sub.retry_policy if sub is not None else RetryPolicy()
    circuit = sub.circuit if sub is not None else CircuitPolicy()
    filters = [f.model_dump() for f in sub.filters] if sub is not None else []
    return page(request, "subscription.html", who, page="Destinations", code=code,
                name=None if sub is None and invalid is None else name, sub=sub,
                invalid=invalid, pushers=pushers,
                retry_policy=json.dumps(policy.model_dump()),
                circuit=json.dumps(circuit.model_dump()),
                filters=json.dumps(filters))


@router.get("/ui/audit", response_model=None)
async def audit_page(request: Request, who: UiUser, users: Users,
                     before: str = "") -> Response:
    entries = await users.audit_log(PAGE_SIZE, _utc(before))
    next_url = (f"/ui/audit?before={entries[-1]['at'].isoformat()}"
                if len(entries) == PAGE_SIZE else None)
    return page(request, "audit.html", who, page="Audit", entries=entries,
                next_url=next_url)
