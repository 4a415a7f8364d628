"""The management API. Every route but /health and the login needs a user (session cookie or
API token) or the bootstrap token, with the role the route names (viewer, operator, admin); every
change is written to the audit log (`GET /v1/audit`). While MongoDB does not answer, what needs
it answers 503 within seconds (admin/outage.py).

`create_app` builds the app, keeps the service's parts in its state (admin/deps.py) and
includes the routers: this module's (configuration: destinations, subscriptions, runtime,
producer apps; messages) and those of the other admin modules."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from fastapi import APIRouter, FastAPI, Response

from admin import (
    invalid_docs,
    operations,
    pushers,
    removal,
    replication,
    requests_routes,
    scheduled,
    schema_routes,
    schema_ui,
    subscription_health,
    teams_routes,
    users_routes,
)
from admin.access import (
    AdministersBus,
    Catalogue,
    ChangesApp,
    ChangesDestination,
    ChangesSubscription,
    CreatesFromBody,
    OperatesSubscription,
    Public,
    ReadsBus,
    ReadsMessages,
    check_moved,
    check_new,
    check_subscribe,
    is_bus_admin,
    sees,
    team_for_new,
    tell_if_someone_else,
)
from admin.deps import AdminParts, Deletions, Service, Store, Users
from admin.invalid_docs import LIST_RESPONSES, valid_items
from admin.message_list import Cursor, ListQuery
from admin.outage import MongoOutageGuard, install_outage_handlers
from admin.params import (
    AppName,
    BizIdQuery,
    CursorQuery,
    DestinationCode,
    DestinationQuery,
    Limit,
    StoredId,
    SubscriptionName,
    SubscriptionQuery,
)
from admin.removal import refuse_while_deleting
from admin.schemas import AppIn, BreakGlassIn, DestinationIn, RotateIn, RuntimeIn, SubscriptionIn
from admin.service import AdminService
from admin.ui import add_ui
from msgbus.auth import hash_api_key, new_api_key
from msgbus.errors import InvalidStoredDocument, NotFound
from msgbus.http import ServerTiming, add_readiness, include_routes, service_app
from msgbus.models import (
    DeliveryStatus,
    Destination,
    PublishPolicy,
    Subscription,
    Timestamp,
    new_signing_secret,
    subscription_id,
    utcnow,
)
from msgbus.sealing import SecretKeys
from msgbus.store import MongoStore
from msgbus.store.users import UserStore
from msgbus.teams import PLATFORM_TEAM, team_of_label
from msgbus.users import Principal

probes = APIRouter()
router = APIRouter()


def create_app(service: AdminService) -> FastAPI:
    app = service_app("msgbus admin", service)
    app.state.authenticator = service.auth
    app.state.parts = AdminParts.of(service)
    include_routes(app, probes)
    add_readiness(app, partial(_readiness, service.store), required=("mongo",),
                  service="admin")
    for routes in (router, invalid_docs.router, pushers.router, removal.router,
                   operations.router, users_routes.router, replication.router,
                   replication.ui_router, schema_routes.router, scheduled.router,
                   scheduled.ui_router, subscription_health.router, teams_routes.router,
                   requests_routes.router):
        include_routes(app, routes)
    add_ui(app)
    include_routes(app, schema_ui.router)
    install_outage_handlers(app, service.store.gate)
    app.add_middleware(MongoOutageGuard, store=service.store)
    app.add_middleware(ServerTiming)
    return app


@probes.get("/health", dependencies=[Public])
async def health(store: Store) -> dict[str, Any]:
    return {"status": "ok", "mongo": await store.ping(), "mongo_gate": store.gate.state()}


async def _readiness(store: MongoStore) -> dict[str, bool]:
    return {"mongo": await store.ping()}


@router.get("/v1/services")
async def list_services(_: ReadsBus, service: Service) -> dict[str, Any]:
    """Every service process (receivers, dispatchers, compensators, admins) and whether it
    sees MongoDB as available, each read from its /health now (admin/services.py). Answers
    while MongoDB is down: the processes are those this admin last read from `instances`."""
    return await service.services.status()


@router.get("/v1/destinations", responses=LIST_RESPONSES)
async def list_destinations(_: Catalogue, response: Response,
                            store: Store) -> list[dict[str, Any]]:
    loaded = await store.config.load_destinations()
    return [d.model_dump(mode="json") for d in valid_items(response, loaded)]


@router.put("/v1/destinations/{code}", openapi_extra={"responses": {"200": {"links": {
    "its_subscriptions": {"operationId": "list_subscriptions",
                          "parameters": {"destination": "$request.path.code"}}}}}})
async def put_destination(code: DestinationCode, body: DestinationIn, who: ChangesDestination,
                          store: Store, users: Users, deletions: Deletions) -> dict[str, Any]:
    await refuse_while_deleting(deletions, code)
    asked = body.team or (team_of_label(body.owner) if body.owner else None)
    fields = body.model_dump(exclude={"team", "owner"}, exclude_none=True)
    try:  # a broker switch is remembered: dispatchers drain the previous broker
        existing = await store.config.get_destination(code)
        team = check_moved(who, existing.team, asked)
        switched = existing.with_broker(body.broker, utcnow())
        destination = Destination.model_validate(
            switched.model_dump() | {k: v for k, v in fields.items() if k != "broker"}
            | {"team": team})
    except (NotFound, InvalidStoredDocument):  # new, or replacing one that is invalid
        team = team_for_new(who, asked, PLATFORM_TEAM if is_bus_admin(who) else None)
        check_new(who, team)
        destination = Destination(code=code, team=team,
                                  **({"publishers": PublishPolicy.TEAM} | fields))
    await store.config.save_destination(destination)
    await users.audit(who, "destination.put", code, body.model_dump(mode="json"))
    return destination.model_dump(mode="json")


@router.get("/v1/runtime")
async def get_runtime(_: ReadsBus, service: Service) -> dict[str, Any]:
    return await service.runtime_view()


@router.patch("/v1/runtime")
async def patch_runtime(body: RuntimeIn, who: AdministersBus, service: Service) -> dict[str, Any]:
    await service.update_runtime(body)
    await service.users.audit(who, "runtime.patch", "runtime",
                              body.model_dump(mode="json", exclude_none=True))
    return await service.runtime_view()


@router.get("/v1/subscriptions", responses=LIST_RESPONSES, operation_id="list_subscriptions")
async def list_subscriptions(who: Catalogue, response: Response, store: Store,
                             destination: DestinationQuery = None) -> list[dict[str, Any]]:
    """The subscriptions the caller may read (each with its team)."""
    loaded = await store.config.load_subscriptions(destination)
    teams = {d.code: d.team for d in await store.config.list_destinations()}
    shown = []
    for sub in valid_items(response, loaded):
        team = sub.owning_team(teams)
        if sees(who, team):
            shown.append(sub.shown() | {"team": team})
    return shown


@router.put("/v1/destinations/{code}/subscriptions/{name}")
async def put_subscription(code: DestinationCode, name: SubscriptionName,
                           body: SubscriptionIn, who: ChangesSubscription, service: Service,
                           deletions: Deletions) -> dict[str, Any]:
    store = service.store
    destination = await store.config.get_destination(code)
    await refuse_while_deleting(deletions, code, name)
    await service.check_urls(body)
    sub_id = subscription_id(code, name)
    try:
        existing = await store.config.get_subscription(sub_id)
        team = check_moved(who, existing.team or destination.team, body.team)
        body = service.keeping_secrets(body, existing)
        sub = Subscription.model_validate(
            existing.model_dump() | body.model_dump() | {"team": team, "updated_at": utcnow()})
    except NotFound:
        team = team_for_new(who, body.team, destination.team)
        check_new(who, team)
        check_subscribe(who, team, destination)
        body = service.keeping_secrets(body, None)
        sub = Subscription(destination=code, name=name, **(body.model_dump() | {"team": team}))
    except InvalidStoredDocument:
        sub = await service.replacement_subscription(code, name, body)
    await store.config.save_subscription(sub)
    await service.users.audit(who, "subscription.put", sub.id, body.shown())
    # The signing secrets are shown to whoever configures the subscriber.
    return sub.shown() | {
        "signing_secrets": [service.keys.open(s) for s in sub.signing_secrets]}


async def change_subscription(store: MongoStore, users: UserStore, code: str, name: str,
                              who: Principal, action: str,
                              change: Callable[[Subscription], dict[str, Any]],
                              details: dict[str, Any] | None = None) -> Subscription:
    """Reads the subscription, applies the fields `change` returns for it, saves it,
    audits it as `action` (with `details`)."""
    sub = await store.config.get_subscription(f"{code}/{name}")
    sub = sub.model_copy(update={**change(sub), "updated_at": utcnow()})
    await store.config.save_subscription(sub)
    await users.audit(who, action, sub.id, details)
    return sub


async def _set_paused(store: MongoStore, users: UserStore, code: str, name: str,
                      who: Principal, paused: bool) -> dict[str, Any]:
    """Pauses or resumes the subscription; its view without the signing secrets."""
    action = "subscription.pause" if paused else "subscription.resume"
    sub = await change_subscription(store, users, code, name, who, action,
                                    lambda _: {"paused": paused})
    return sub.shown()


@router.post("/v1/destinations/{code}/subscriptions/{name}/pause")
async def pause_subscription(code: DestinationCode, name: SubscriptionName,
                             who: OperatesSubscription,
                             store: Store, users: Users, service: Service) -> dict[str, Any]:
    """Dispatchers stop pushing within seconds; messages wait in the broker. Its team hears
    of it when someone else paused it."""
    paused = await _set_paused(store, users, code, name, who, paused=True)
    await tell_if_someone_else(store, service.notifier, who, "subscription.paused", code, name)
    return paused


@router.post("/v1/destinations/{code}/subscriptions/{name}/resume")
async def resume_subscription(code: DestinationCode, name: SubscriptionName,
                              who: OperatesSubscription,
                              store: Store, users: Users) -> dict[str, Any]:
    return await _set_paused(store, users, code, name, who, paused=False)


def secrets_view(sub: Subscription, keys: SecretKeys) -> dict[str, Any]:
    """The answer of every secrets route: newest first, opened; the previous one (a
    rotation's) is signed with until `previous_secret_until` (null: until it is dropped)."""
    return {"subscription": sub.id,
            "signing_secrets": [keys.open(s) for s in sub.signing_secrets],
            "previous_secret_until": (sub.previous_secret_until.isoformat()
                                      if len(sub.signing_secrets) > 1
                                      and sub.previous_secret_until else None)}


@router.post("/v1/destinations/{code}/subscriptions/{name}/secrets/reveal")
async def reveal_secrets(code: DestinationCode, name: SubscriptionName, who: ChangesSubscription,
                         store: Store, users: Users, service: Service) -> dict[str, Any]:
    """The subscription's signing secrets, newest first (a second one after a rotation).
    Admin only; every reveal is audited. A POST, not a GET: it is an action the audit log
    records, and no cache or prefetch may repeat it."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    await users.audit(who, "subscription.secret_reveal", sub.id)
    return secrets_view(sub, service.keys)


@router.post("/v1/destinations/{code}/subscriptions/{name}/secrets/rotate")
async def rotate_secret(code: DestinationCode, name: SubscriptionName, who: ChangesSubscription,
                        store: Store, users: Users, service: Service,
                        body: RotateIn | None = None) -> dict[str, Any]:
    """A new signing secret; pushes are signed with it and the previous one for the overlap
    (`overlap_s`, 24 h by default; null: until `.../secrets/previous` is deleted), so the
    subscriber can switch without a gap."""
    overlap_s = (body or RotateIn()).overlap_s
    until = None if overlap_s is None else utcnow() + timedelta(seconds=overlap_s)
    sub = await change_subscription(
        store, users, code, name, who, "subscription.secret_rotate",
        lambda old: {"signing_secrets": [new_signing_secret(), old.signing_secrets[0]],
                     "previous_secret_until": until},
        {"overlap_s": overlap_s})
    return secrets_view(sub, service.keys)


@router.delete("/v1/destinations/{code}/subscriptions/{name}/secrets/previous")
async def drop_previous_secret(code: DestinationCode, name: SubscriptionName,
                               who: ChangesSubscription, store: Store, users: Users,
                               service: Service) -> dict[str, Any]:
    """Pushes are signed with the current secret only, from now on."""
    sub = await change_subscription(store, users, code, name, who, "subscription.secret_drop",
                                    lambda old: {"signing_secrets": old.signing_secrets[:1],
                                                 "previous_secret_until": None})
    return secrets_view(sub, service.keys)


@router.post("/v1/apps", status_code=201)
async def create_app_key(body: AppIn, who: CreatesFromBody, service: Service) -> dict[str, Any]:
    team = team_for_new(who, body.team, PLATFORM_TEAM if is_bus_admin(who) else None)
    check_new(who, team)
    key = await service.create_producer_app(body.name, body.destinations, team)
    await service.users.audit(who, "app.create", body.name,
                              {"destinations": body.destinations, "team": team})
    return {"name": body.name, "destinations": body.destinations, "team": team, "api_key": key,
            "note": "the key is shown only once; msgbus stores only its hash"}


@router.get("/v1/apps", responses=LIST_RESPONSES)
async def list_apps(_: Catalogue, response: Response, store: Store) -> list[dict[str, Any]]:
    """Producer apps without their key hashes: name, team, destinations, how many keys."""
    return [{"name": a.name, "team": a.team, "destinations": a.destinations,
             "keys": len(a.key_hashes), "created_at": a.created_at, "revoked_at": a.revoked_at}
            for a in valid_items(response, await store.producers.load_apps())]


@router.post("/v1/apps/{name}/keys", status_code=201)
async def add_app_key(name: AppName, who: ChangesApp, store: Store,
                      users: Users) -> dict[str, Any]:
    """A further key (to rotate without a gap: deploy it, then revoke the old ones)."""
    key = new_api_key()
    await store.producers.add_app_key(name, hash_api_key(key))
    await users.audit(who, "app.key_add", name)
    return {"name": name, "api_key": key,
            "note": "the key is shown only once; msgbus stores only its hash"}


@router.delete("/v1/apps/{name}/keys", status_code=204)
async def revoke_app_keys(name: AppName, who: ChangesApp, store: Store, users: Users) -> None:
    """Every key of the app stops working within 30 s (the receivers' key cache)."""
    await store.producers.revoke_app_keys(name)
    await users.audit(who, "app.keys_revoke", name)


@router.get("/v1/messages")
async def find_messages(who: ReadsMessages, service: Service, response: Response,
                        biz_id: BizIdQuery = None, destination: DestinationQuery = None,
                        subscription: SubscriptionQuery = None,
                        status: DeliveryStatus | None = None,
                        since: Timestamp | None = None, until: Timestamp | None = None,
                        before: CursorQuery = None, after: CursorQuery = None,
                        limit: Limit = 100) -> list[dict[str, Any]]:
    """Messages newest first, each with its delivery state per subscription (`deliveries`),
    in keyset pages: the `x-next-cursor` header of an answer is the `before` of the next
    (older) page, `x-previous-cursor` the `after` of the newer one (admin/message_list.py).
    Only the messages of destinations the caller reads (admin/message_access.py): a page may
    hold fewer than `limit` then."""
    query = ListQuery(biz_id=biz_id, destination=destination, subscription=subscription,
                      state=status, since=since, until=until)
    cursor = (Cursor.decode(after, "after") if after
              else Cursor.decode(before, "before") if before else None)
    page = await service.message_page(who, query, cursor, older=after is None, limit=limit)
    for header, at in (("x-next-cursor", page.older), ("x-previous-cursor", page.newer)):
        if at is not None:
            response.headers[header] = at.encode()
    return [service.message_summary(doc) for doc in page.messages]


@router.get("/v1/messages/{message_id}")
async def message_detail(message_id: StoredId, who: ReadsMessages,
                         service: Service) -> dict[str, Any]:
    return await service.message_timeline(message_id, who)


@router.post("/v1/secrets/reseal")
async def reseal_secrets(who: AdministersBus, service: Service) -> dict[str, Any]:
    """Every stored secret (signing and notify secrets) sealed again with this admin's newest
    key (`MSGBUS_SECRET_KEYS`' first): after a new key was put first on every service, and
    before the old one goes, which `left` 0 allows."""
    done = await service.reseal_secrets()
    await service.users.audit(who, "secrets.reseal", done.key_id, done.as_dict())
    return done.as_dict()


@router.post("/v1/break-glass", status_code=201)
async def break_glass(body: BreakGlassIn, who: AdministersBus, service: Service
                      ) -> dict[str, Any]:
    """An admin reads every destination's messages for `minutes` (at most an hour); the
    start and every read are in the audit log, with the reason."""
    until = utcnow() + timedelta(minutes=body.minutes)
    broken = await service.users.break_glass(who.name, body.reason, until)
    await service.users.audit(who, "break_glass.start", who.name,
                              {"reason": body.reason, "until": until.isoformat()})
    return broken
