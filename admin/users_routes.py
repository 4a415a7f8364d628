"""Sessions, users, API tokens and the audit log of the management API.

- `POST /v1/session` logs in (user name and password) and sets the session cookie; the answer
  carries the session's CSRF token. `GET /v1/session` says who you are; `DELETE` logs out.
- Users (admin only): list, create or change (`PUT /v1/users/{name}`), delete.
- API tokens: any user creates and revokes their own (`/v1/tokens`); an admin lists all. A token
  is shown once; only its hash is stored.
- `GET /v1/audit`: every change, newest first (viewer).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request, Response

from admin.access import AdministersBus, AsCaller, Catalogue, Public
from admin.deps import Service, Users
from admin.invalid_docs import LIST_RESPONSES, valid_items
from admin.params import GeneratedId, Limit, TargetQuery, TeamQuery, UserName
from admin.schemas import LoginIn, TokenIn, UserIn
from admin.security import SESSION_COOKIE, client_address
from msgbus.errors import Forbidden, InvalidInput
from msgbus.models import Timestamp, utcnow
from msgbus.permissions import Right, check
from msgbus.users import Principal, Role, hash_password


def _user_view(doc: dict[str, Any]) -> dict[str, Any]:
    return {"name": doc["_id"], **{k: v for k, v in doc.items()
                                   if k not in ("_id", "password_hash")}}


router = APIRouter()


@router.post("/v1/session", dependencies=[Public])
async def login(body: LoginIn, request: Request, response: Response,
                service: Service) -> dict[str, Any]:
    users, sessions = service.users, service.auth.sessions
    user = await service.signins.user(body.username, body.password, client_address(request))
    cookie, session_id = sessions.issue(body.username)
    response.set_cookie(SESSION_COOKIE, cookie, max_age=int(sessions.ttl_s), httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    principal = Principal(body.username, Role(user["role"]), "session", session_id)
    await users.audit(principal, "session.login", body.username)
    return {"name": body.username, "role": user["role"],
            "csrf_token": sessions.csrf_token(session_id), "expires_in_s": sessions.ttl_s}


@router.get("/v1/session")
async def whoami(who: AsCaller, service: Service) -> dict[str, Any]:
    answer: dict[str, Any] = {"name": who.name, "role": who.role.value, "via": who.via,
                              "teams": {team: role.value for team, role in who.teams.items()}}
    if who.session_id is not None:
        answer["csrf_token"] = service.auth.sessions.csrf_token(who.session_id)
    return answer


@router.delete("/v1/session", status_code=204, dependencies=[Public])
async def logout(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE)


@router.get("/v1/users", responses=LIST_RESPONSES)
async def list_users(_: AdministersBus, response: Response, users: Users) -> list[dict[str, Any]]:
    return [_user_view(u) for u in valid_items(response, await users.load_users())]


@router.get("/v1/signins/locked")
async def locked_signins(_: AdministersBus, service: Service) -> list[dict[str, Any]]:
    """Who is locked out after failed sign-ins or wrong tokens, and until when: a user at an
    address (`user-address`) or an address (msgbus/throttle.py)."""
    locked = await service.signins.throttle.locked()
    return [{"kind": name.partition(":")[0], "key": name.partition(":")[2],
             "failures": f.count, "last_failure_at": datetime.fromtimestamp(f.last, UTC),
             "locked_until": datetime.fromtimestamp(f.locked_until, UTC)}
            for name, f in locked.items()]


@router.put("/v1/users/{name}")
async def put_user(name: UserName, body: UserIn, who: AdministersBus,
                   users: Users) -> dict[str, Any]:
    state = await users.user_state(name)
    if state != "valid":  # a new user, or one in place of a stored one that is invalid
        if body.password is None or body.role is None:
            what = "a new user" if state == "missing" else (
                "replacing a stored user that does not validate")
            raise InvalidInput(f"{what} needs a password and a role", field="password")
        doc = await users.create_user(name, hash_password(body.password), body.role,
                                      replace_invalid=state == "invalid")
        await users.audit(who, "user.create", name, {"role": body.role.value})
        return _user_view(doc)
    fields: dict[str, Any] = {}
    if body.password is not None:
        fields["password_hash"] = hash_password(body.password)
    if body.role is not None:
        fields["role"] = body.role.value
    if body.disabled is not None:
        fields["disabled"] = body.disabled
    doc = await users.update_user(name, **fields)
    await users.audit(who, "user.change", name, {
        k: v for k, v in fields.items() if k != "password_hash"}
        | ({"password": "changed"} if "password_hash" in fields else {}))
    return _user_view(doc)


@router.delete("/v1/users/{name}", status_code=204)
async def delete_user(name: UserName, who: AdministersBus, users: Users) -> None:
    if name == who.name:
        raise Forbidden("you cannot delete yourself")
    await users.delete_user(name)
    await users.audit(who, "user.delete", name)


@router.post("/v1/tokens", status_code=201)
async def create_token(body: TokenIn, who: AsCaller, users: Users) -> dict[str, Any]:
    if who.via == "bootstrap":
        raise InvalidInput("the bootstrap token has no user: create a user and log in as "
                           "them to make API tokens", field="authorization")
    role = body.role or who.role
    if not who.role.allows(role):
        raise Forbidden(f"a {who.role.value} cannot make a {role.value} token")
    expires_at = utcnow() + timedelta(days=body.expires_in_days)
    token, doc = await users.create_token(who.name, body.name, role, expires_at)
    await users.audit(who, "token.create", doc["token_id"],
                      {"name": body.name, "role": role.value,
                       "expires_at": expires_at.isoformat()})
    return {"token": token, "token_id": doc["token_id"], "name": body.name,
            "role": role.value, "expires_at": expires_at, "note": "the token is shown only once"}


@router.get("/v1/tokens", responses=LIST_RESPONSES)
async def list_tokens(who: AsCaller, response: Response,
                      users: Users) -> list[dict[str, Any]]:
    loaded = await users.load_tokens(None if who.role is Role.ADMIN else who.name)
    return valid_items(response, loaded)


@router.delete("/v1/tokens/{token_id}", status_code=204)
async def revoke_token(token_id: GeneratedId, who: AsCaller, users: Users) -> None:
    await users.revoke_token(token_id, None if who.role is Role.ADMIN else who.name)
    await users.audit(who, "token.revoke", token_id)


@router.get("/v1/audit")
async def audit_log(who: Catalogue, users: Users, limit: Limit = 100,
                    before: Timestamp | None = None, target: TargetQuery = None,
                    team: TeamQuery = None) -> list[dict[str, Any]]:
    """Who changed what: every entry (the bus's operators and admins), or, with `team`, what
    that team owns and what its members did (its members)."""
    check(who, Right.READ, team)
    return await users.audit_log(limit, before, target, team)
