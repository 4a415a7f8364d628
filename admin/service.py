"""`AdminService`: what the management API does beyond plain reads and writes."""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from admin.message_access import MessageAccess
from admin.message_list import Cursor, ListQuery, Page, list_page
from admin.oidc import CompanySignIn
from admin.schemas import RuntimeIn, SubscriptionIn
from admin.security import Authenticator, Sessions, SignIns, signin_policies
from admin.services import ServiceDirectory
from msgbus.auth import hash_api_key, new_api_key
from msgbus.delivery.senders import make_sender
from msgbus.delivery.shares import CapShares
from msgbus.errors import Conflict, InvalidConfig
from msgbus.models import (
    BrokerKind,
    RuntimeConfig,
    Subscription,
    SubscriptionSettings,
    utcnow,
)
from msgbus.notify import Notifier
from msgbus.settings import AdminSettings, sealing_keys
from msgbus.store import MongoStore
from msgbus.store.sealed_secrets import Resealed
from msgbus.store.shares import ShareStore
from msgbus.store.users import UserStore
from msgbus.throttle import Throttle
from msgbus.tracecontext import trace_id_of
from msgbus.users import Principal

log = logging.getLogger(__name__)

class AdminService:
    def __init__(self, settings: AdminSettings) -> None:
        if not settings.token.get_secret_value():
            raise ValueError("MSGBUS_ADMIN_TOKEN is not set")
        self.settings = settings
        self.keys = sealing_keys(settings.connections)  # seal and open stored secrets
        self.store = MongoStore(settings.connections.mongo_uri, settings.connections.mongo_db,
                                component="admin", keys=self.keys)
        self.users = UserStore(self.store)
        secret = settings.session_secret.get_secret_value() or secrets.token_urlsafe(32)
        throttle = Throttle(self.store.signins, signin_policies(
            settings.signin_lock_first_s, settings.signin_lock_max_s,
            settings.signin_address_lock_after))
        self.signins = SignIns(self.users, throttle)
        self.messages = MessageAccess(self.store, self.users)
        self.auth = Authenticator(self.users, self.store.teams,
                                  Sessions(secret, settings.session_ttl_s),
                                  settings.token.get_secret_value(), self.store.gate, throttle)
        self.company: CompanySignIn | None = None
        if settings.oidc.enabled:
            self.company = CompanySignIn(settings.oidc, self.store, self.users,
                                         self.auth.sessions, self.keys)
            self.auth.refresh_company_session = self.company.refresh_if_due
        conn = settings.connections
        # test pushes count against the subscription's cap like every other push
        self.shares = CapShares(ShareStore(self.store),
                                instance=f"{socket.gethostname()}-{os.getpid()}",
                                component="admin", heartbeat_s=conn.share_heartbeat_s,
                                lease_s=conn.share_lease_s,
                                health_url=conn.health_url(settings.host, settings.port))
        self.egress = settings.push.egress_policy()
        self.notify_sender = make_sender("h1", instance=self.shares.instance,
                                         push=settings.push, max_connections=8, keys=self.keys)
        self.notifier = Notifier(self.store, self.notify_sender, self.keys,
                                 component=self.shares.instance,
                                 ui_url=conn.ui_url, cooldown_s=conn.notify_cooldown_s)
        self.shares.on_circuit = self.notifier.circuit_changed
        self.services = ServiceDirectory(self.store, own_instance=self.shares.instance,
                                         own_health_url=self.shares.health_url)

    async def start(self) -> None:
        await self.store.ensure_indexes()
        await self.users.ensure_indexes()
        await self.reseal_secrets()  # a plain value (stored before 0.2) is sealed now
        await self.notify_sender.start()
        self.notifier.start()
        self.shares.start()
        self.services.start()

    async def close(self) -> None:
        await self.services.close()
        await self.notifier.close()
        await self.notify_sender.close()
        await self.shares.close()
        await self.store.close()

    async def create_producer_app(self, name: str, destinations: Sequence[str],
                                  team: str) -> str:
        key = new_api_key()
        await self.store.producers.create_app(name, hash_api_key(key), destinations, team)
        return key

    async def reseal_secrets(self) -> Resealed:
        """Every stored secret sealed with the newest key (msgbus/store/sealed_secrets.py)."""
        done = await self.store.reseal_secrets(self.keys)
        if done.resealed or done.left:
            log.warning("secrets: %d documents sealed again with key %s; %d values left under "
                        "another key or plain", done.resealed, done.key_id, done.left)
        return done

    async def check_egress(self, url: str, field: str = "url") -> None:
        """A 422 naming `field` when the egress policy refuses pushes to `url` (its host is, or
        resolves to, only addresses it refuses); every push checks again."""
        refusal = await self.egress.url_refusal(url)
        if refusal is not None:
            raise InvalidConfig(refusal, field=field)

    @staticmethod
    def keeping_secrets(body: SubscriptionIn, stored: Subscription | None) -> SubscriptionIn:
        """`body` with each masked secret ('********') replaced by the stored one."""
        if body.auth is None:
            return body
        try:
            auth = body.auth.keeping(stored.auth if stored is not None else None)
        except ValueError as exc:
            raise InvalidConfig(str(exc), field="auth") from None
        return body.model_copy(update={"auth": auth})

    async def check_urls(self, settings: SubscriptionSettings) -> None:
        """`check_egress` of every URL the bus will call for the subscription."""
        await self.check_egress(str(settings.url))
        if settings.auth is not None and settings.auth.oauth2 is not None:
            await self.check_egress(str(settings.auth.oauth2.token_url),
                                    field="auth.oauth2.token_url")

    async def create_subscription(self, code: str, name: str, team: str,
                                  settings: dict[str, Any]) -> Subscription:
        """A new subscription `name` of `team` to destination `code` (a Conflict if it
        exists)."""
        sub = Subscription(destination=code, name=name, **(settings | {"team": team}))
        await self.check_urls(sub)
        if await self.store.config.stored_subscription(sub.id) is not None:
            raise Conflict(f"subscription {sub.id} exists already", field="name")
        await self.store.config.save_subscription(sub)
        return sub

    async def replacement_subscription(self, code: str, name: str,
                                       body: SubscriptionIn) -> Subscription:
        """The subscription `body` defines, in place of a stored one that does not validate:
        its signing secrets (which the subscriber verifies pushes with) and creation time are
        kept when they still validate."""
        body = self.keeping_secrets(body, None)
        fresh = Subscription(destination=code, name=name, **body.model_dump())
        stored = await self.store.config.stored_subscription(fresh.id) or {}
        kept = {k: stored[k] for k in ("signing_secrets", "created_at") if k in stored}
        try:
            return Subscription.model_validate(fresh.model_dump() | kept)
        except ValidationError:
            return fresh

    async def runtime_view(self) -> dict[str, Any]:
        """The runtime settings, with the clusters each broker kind has to choose from."""
        runtime = await self.store.config.get_runtime()
        conn = self.settings.connections
        return runtime.model_dump(mode="json") | {"clusters": {
            kind.value: list(conn.clusters(kind)) for kind in (BrokerKind.KAFKA,
                                                              BrokerKind.RABBITMQ)}}

    async def update_runtime(self, change: RuntimeIn) -> RuntimeConfig:
        runtime = await self.store.config.get_runtime()
        update: dict[str, Any] = {"updated_at": utcnow()}
        if change.record_rate_per_s is not None:
            update["record_rate_per_s"] = change.record_rate_per_s
        runtime = runtime.model_copy(update=update)
        if change.active_clusters is not None:
            conn = self.settings.connections
            for kind, cluster in change.active_clusters.items():
                known = list(conn.clusters(kind))
                if cluster not in known:
                    raise InvalidConfig(
                        f"{kind.value} has no cluster {cluster!r}; configured: "
                        f"{', '.join(known) or 'none'}", field="active_clusters")
                runtime = runtime.with_active_cluster(kind, cluster, known, utcnow())
        await self.store.config.save_runtime(runtime)
        return runtime

    @staticmethod
    def message_summary(doc: dict[str, Any]) -> dict[str, Any]:
        summary = {k: v for k, v in doc.items() if k not in ("body", "_id")} | {
            "message_id": doc["_id"]}
        if doc.get("traceparent"):
            summary["trace_id"] = trace_id_of(doc["traceparent"])
        return summary

    async def message_page(self, who: Principal, query: ListQuery, cursor: Cursor | None, *,
                           older: bool, limit: int) -> Page:
        """A page of the message list (admin/message_list.py) with only the messages of
        destinations `who` reads: one named is checked (a 403 when not), else the others are
        left out (the page may hold fewer than `limit` then)."""
        named = query.destination or (query.subscription.partition("/")[0]
                                      if query.subscription else None)
        readable = None
        if named:
            await self.messages.check(who, named, "a message list")
        else:
            readable = await self.messages.readable(who)
        found = await list_page(self.store, query, cursor, older=older, limit=limit)
        if readable is None:
            return found
        return dataclasses.replace(found, messages=[
            m for m in found.messages if m["destination"] in readable])

    async def message_timeline(self, message_id: str, who: Principal) -> dict[str, Any]:
        """The message and its trace, if `who` reads its destination's messages."""
        message = await self.store.traces.get_message(message_id)
        await self.messages.check(who, message["destination"], message_id)
        body = bytes(message["body"])
        summary = self.message_summary(message)
        summary["body"] = body.decode("utf-8", "replace")
        deliveries = await self.store.traces.deliveries_of(message_id)
        attempts = await self.store.traces.attempts_of(message_id)
        for d in deliveries:
            d.pop("_id", None)
            d["attempts_log"] = [
                {k: v for k, v in a.items() if k not in ("_id", "message_id", "subscription")}
                for a in attempts if a["subscription"] == d["subscription"]]
        return {"message": summary, "deliveries": deliveries}
