"""What the management API's handlers get through FastAPI dependencies.

`create_app` keeps the service's parts in `app.state.parts` (`AdminParts`: built once per app,
since the dashboard caches its figures); the handlers of the module-level routers name what
they need (`store: Store`, `users: Users`, ...) and each dependency reads it from the request's
app. The web UI's pages take `UiUser`: the logged-in user, or a 303 to the login page
(`LoginRequired`, which `to_login` answers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import RedirectResponse

from admin.dashboard import DashboardData
from admin.service import AdminService
from msgbus.delivery.shares import CapShares
from msgbus.errors import Unauthorized
from msgbus.store import MongoStore
from msgbus.store.claims import DeliveryClaims
from msgbus.store.deletions import DeletionStore
from msgbus.store.replays import ReplayStore
from msgbus.store.requests import SubscriptionRequests
from msgbus.store.users import UserStore
from msgbus.users import Principal

LOGIN_PAGE = "/ui/login"


@dataclass(frozen=True, slots=True)
class AdminParts:
    service: AdminService
    deletions: DeletionStore
    claims: DeliveryClaims  # owner "admin": the API's parked deliveries and skips
    ui_claims: DeliveryClaims  # owner "admin-ui": the UI's parked page
    replays: ReplayStore
    dashboard: DashboardData
    requests: SubscriptionRequests

    @classmethod
    def of(cls, service: AdminService) -> AdminParts:
        store = service.store
        return cls(service=service, deletions=DeletionStore(store),
                   claims=DeliveryClaims(store, owner="admin"),
                   ui_claims=DeliveryClaims(store, owner="admin-ui"),
                   replays=ReplayStore(store), dashboard=DashboardData(store),
                   requests=SubscriptionRequests(store))


def parts_of(request: Request) -> AdminParts:
    parts: AdminParts = request.app.state.parts
    return parts


# async: FastAPI runs a plain `def` dependency in a worker thread
async def _parts(request: Request) -> AdminParts:
    return parts_of(request)


async def _service(request: Request) -> AdminService:
    return parts_of(request).service


async def _store(request: Request) -> MongoStore:
    return parts_of(request).service.store


async def _users(request: Request) -> UserStore:
    return parts_of(request).service.users


async def _shares(request: Request) -> CapShares:
    return parts_of(request).service.shares


async def _deletions(request: Request) -> DeletionStore:
    return parts_of(request).deletions


async def _claims(request: Request) -> DeliveryClaims:
    return parts_of(request).claims


async def _replays(request: Request) -> ReplayStore:
    return parts_of(request).replays


Parts = Annotated[AdminParts, Depends(_parts)]
Service = Annotated[AdminService, Depends(_service)]
Store = Annotated[MongoStore, Depends(_store)]
Users = Annotated[UserStore, Depends(_users)]
Shares = Annotated[CapShares, Depends(_shares)]
Deletions = Annotated[DeletionStore, Depends(_deletions)]
Claims = Annotated[DeliveryClaims, Depends(_claims)]
Replays = Annotated[ReplayStore, Depends(_replays)]


async def _requests(request: Request) -> SubscriptionRequests:
    return parts_of(request).requests


Requests = Annotated[SubscriptionRequests, Depends(_requests)]


class LoginRequired(Exception):
    """Raised by `UiUser` for a request without a valid session or token."""


async def to_login(_: Request, __: Exception) -> RedirectResponse:
    """The exception handler of LoginRequired."""
    return RedirectResponse(LOGIN_PAGE, status_code=303)


async def _ui_user(request: Request) -> Principal:
    try:
        return await parts_of(request).service.auth.principal(request)
    except Unauthorized:
        raise LoginRequired() from None


UiUser = Annotated[Principal, Depends(_ui_user)]
