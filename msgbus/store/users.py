"""`UserStore`: admin users, their API tokens and the audit log, in MongoDB.

Collections: users (`_id` = user name; a scrypt hash, never the password), api_tokens (`_id` =
SHA-256 of the token; the token itself is shown once and never stored) and audit (append-only:
who changed what, when).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.errors import DuplicateKeyError

from msgbus.errors import Conflict, InvalidStoredDocument, NotFound
from msgbus.ids import uuid7
from msgbus.models import utcnow
from msgbus.store.checked import (
    Loaded,
    find_valid,
    read_each,
    read_valid,
    storable,
)
from msgbus.store.mongo import MongoStore
from msgbus.teams import TeamRole
from msgbus.users import (
    Principal,
    Role,
    TokenRecord,
    UserRecord,
    hash_api_token,
    new_api_token,
)


def _without_password_hash(doc: dict[str, Any]) -> dict[str, Any]:
    UserRecord.model_validate(doc)
    return {k: v for k, v in doc.items() if k != "password_hash"}


def _token_view(doc: dict[str, Any]) -> dict[str, Any]:
    TokenRecord.model_validate(doc)
    return {k: v for k, v in doc.items() if k != "_id"}


class UserStore:
    """Users and tokens whose stored documents do not validate are treated as absent (they
    cannot log in or authenticate), reported, and listed by the admin to be fixed (a PUT of
    the user replaces it) or deleted."""

    def __init__(self, store: MongoStore) -> None:
        self._store = store
        self._invalid_log = store.invalid_log
        self._users = store.db["users"]
        self._tokens = store.db["api_tokens"]
        self._audit = store.db["audit"]
        self._glass = store.db["break_glass"]

    async def ensure_indexes(self) -> None:
        await self._tokens.create_index([("user", ASCENDING)])
        await self._audit.create_index([("at", DESCENDING)])
        await self._glass.create_index([("user", ASCENDING), ("until", DESCENDING)])
        await self._audit.create_index([("owner_team", ASCENDING), ("at", DESCENDING)])
        await self._audit.create_index([("teams", ASCENDING), ("at", DESCENDING)])

    # --- users ---------------------------------------------------------------------------

    async def count_users(self) -> int:
        return int(await self._users.count_documents({}))

    async def create_user(self, name: str, password_hash: str, role: Role, *,
                          replace_invalid: bool = False) -> dict[str, Any]:
        """A new user; with `replace_invalid`, also in place of a stored user document that
        does not validate."""
        now = utcnow()
        doc = storable({"_id": name, "password_hash": password_hash, "role": role.value,
                        "created_at": now, "updated_at": now, "disabled": False},
                       UserRecord.model_validate)
        if replace_invalid and await self._users.find_one({"_id": name}) is not None:
            await self._users.replace_one({"_id": name}, doc)
            return doc
        try:
            await self._users.insert_one(doc)
        except DuplicateKeyError as exc:
            raise Conflict(f"user {name!r} exists", field="name") from exc
        return doc

    async def get_user(self, name: str) -> dict[str, Any]:
        return await find_valid(self._users, name, "user", "name", UserRecord.model_validate,
                                self._invalid_log)

    async def find_user(self, name: str) -> dict[str, Any] | None:
        """The user's document; None for an unknown user or one whose document does not
        validate (reported)."""
        doc = await self._users.find_one({"_id": name})
        if doc is None or self._check_user(doc) is None:
            return None
        return doc

    async def user_state(self, name: str) -> str:
        """"missing", "invalid" (stored, but does not validate) or "valid"."""
        doc = await self._users.find_one({"_id": name})
        if doc is None:
            return "missing"
        return "invalid" if self._check_user(doc) is None else "valid"

    def _check_user(self, doc: dict[str, Any]) -> UserRecord | None:
        return read_valid(doc, "users", UserRecord.model_validate, self._invalid_log)

    async def load_users(self) -> Loaded[dict[str, Any]]:
        """The users that validate (without their password hashes), and those left out."""
        found = [u async for u in self._users.find({}).sort("_id", 1)]
        loaded = read_each(found, "users", _without_password_hash, self._invalid_log)
        self._invalid_log.whole_collection("users", loaded.invalid)
        return loaded

    async def update_user(self, name: str, **fields: Any) -> dict[str, Any]:
        existing = await self.get_user(name)
        changed = {**existing, **fields, "updated_at": utcnow()}
        storable(changed, UserRecord.model_validate)
        await self._users.update_one({"_id": name}, {"$set": {**fields,
                                                              "updated_at": changed["updated_at"]}})
        return await self.get_user(name)

    async def delete_user(self, name: str) -> None:
        result = await self._users.delete_one({"_id": name})
        if result.deleted_count == 0:
            raise NotFound(f"unknown user {name!r}", field="name")
        await self._tokens.delete_many({"user": name})

    # --- API tokens ----------------------------------------------------------------------

    async def create_token(self, user: str, name: str, role: Role, expires_at: datetime,
                           team_role: TeamRole | None = None) -> tuple[str, dict[str, Any]]:
        """A new token of `user` acting with `role` until `expires_at` (with `team_role`: of
        the team `user` names, `team_token_holder`); returns (the token, shown once; its
        record)."""
        token = new_api_token()
        team = user.removeprefix("team:") if team_role is not None else None
        doc = storable({"_id": hash_api_token(token), "token_id": uuid7(), "user": user,
                        "name": name, "role": role.value, "created_at": utcnow(),
                        "last_used_at": None, "expires_at": expires_at, "team": team,
                        "team_role": None if team_role is None else team_role.value},
                       TokenRecord.model_validate)
        await self._tokens.insert_one(doc)
        return token, doc

    async def principal_for_token(self, token: str) -> Principal | None:
        """The user a token acts for, with the lesser of the token's and the user's role;
        None for an unknown token or a disabled or deleted user."""
        doc = await self._tokens.find_one({"_id": hash_api_token(token)})
        if doc is None:
            return None
        record = read_valid(doc, "api_tokens", TokenRecord.model_validate, self._invalid_log)
        if record is None or (record.expires_at is not None and record.expires_at <= utcnow()):
            return None
        if record.team is not None and record.team_role is not None:
            return Principal(name=f"{record.user}/{record.name}", role=Role.VIEWER, via="token",
                             teams={record.team: record.team_role})
        user = await self.find_user(record.user)
        if user is None or user.get("disabled"):
            return None
        role = min(record.role, Role(user["role"]), key=lambda r: r.rank)
        return Principal(name=user["_id"], role=role, via="token")

    async def load_tokens(self, user: str | None = None) -> Loaded[dict[str, Any]]:
        """The tokens (of `user`, or all) that validate, without their hashes, and those left
        out."""
        query = {} if user is None else {"user": user}
        found = [t async for t in self._tokens.find(query).sort("created_at", 1)]
        loaded = read_each(found, "api_tokens", _token_view, self._invalid_log)
        if user is None:
            self._invalid_log.whole_collection("api_tokens", loaded.invalid)
        return loaded

    async def list_tokens(self, user: str | None = None) -> list[dict[str, Any]]:
        return (await self.load_tokens(user)).items

    async def revoke_token(self, token_id: str, user: str | None = None) -> dict[str, Any]:
        query: dict[str, Any] = {"token_id": token_id}
        if user is not None:
            query["user"] = user
        doc = await self._tokens.find_one_and_delete(query)
        if doc is None:
            raise NotFound(f"unknown token {token_id!r}", field="token_id")
        return {k: v for k, v in doc.items() if k != "_id"}

    # --- break glass -----------------------------------------------------------------------

    async def break_glass(self, user: str, reason: str, until: datetime) -> dict[str, Any]:
        """`user` (an admin) reads every destination's messages until `until`."""
        doc = {"_id": uuid7(), "user": user, "reason": reason, "since": utcnow(),
               "until": until}
        await self._glass.insert_one(doc)
        return {k: v for k, v in doc.items() if k != "_id"}

    async def glass_broken_until(self, user: str) -> datetime | None:
        """Until when `user` has the glass broken (None: not now)."""
        doc = await self._glass.find_one({"user": user, "until": {"$gt": utcnow()}},
                                         sort=[("until", DESCENDING)])
        return None if doc is None else doc["until"]

    # --- audit ---------------------------------------------------------------------------

    async def audit(self, by: Principal, action: str, target: str,
                    details: dict[str, Any] | None = None) -> None:
        """Who (their bus-wide role and their teams) did what to `target`, and the team that
        owns `target` (`owner_team`), when."""
        await self._audit.insert_one({
            "_id": uuid7(), "at": utcnow(), "by": by.name, "role": by.role.value,
            "teams": sorted(by.teams), "via": by.via, "action": action, "target": target,
            "owner_team": await self._owner_team(action, target), "details": details or {}})

    async def _owner_team(self, action: str, target: str) -> str | None:
        """The team that owns what an action changed, by the kind of action (None: the bus,
        a user, or a thing gone already)."""
        kind = action.partition(".")[0]
        code, _, name = target.partition("/")
        try:
            if kind == "team":
                return target
            if kind == "app":
                return (await self._store.producers.get_app(target)).team
            if name:
                return await self._store.config.subscription_team(code, name)
            if kind in ("destination", "messages", "subscription_request", "schema"):
                return (await self._store.config.get_destination(code)).team
        except (NotFound, InvalidStoredDocument):
            return None
        return None

    async def audit_log(self, limit: int, before: datetime | None = None,
                        target: str | None = None, team: str | None = None
                        ) -> list[dict[str, Any]]:
        """The newest entries (before `before`), of `target`, or of what `team` owns or
        its members did."""
        query: dict[str, Any] = {}
        if before is not None:
            query["at"] = {"$lt": before}
        if target is not None:
            query["target"] = target
        if team is not None:
            query["$or"] = [{"owner_team": team}, {"teams": team}]
        cursor = self._audit.find(query, {"_id": 0}).sort("at", DESCENDING).limit(limit)
        return [a async for a in cursor]
