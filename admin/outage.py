"""The admin through a MongoDB outage: every request gets an answer within seconds, never a
hung page.

    request ── what it needs (`need_of`) ── nothing from MongoDB (health, metrics, docs,
       │                                     static files, the login form) ──────────▶ the app
       │                                 └─ answers through an outage itself (the dashboard,
       │                                     GET /v1/services) ──────────────────────▶ the app
       ▼ MongoDB
    gate closed? ── yes ──▶ 503 + Retry-After at once: JSON `{"error": "mongo_unavailable", ...}`,
       │                    or an HTML page under /ui/
       ▼ no
    the handler runs; not answered after CHECK_AFTER_S, MongoDB is pinged (within
    PING_TIMEOUT_S; a ping that gets no answer closes the gate): it answers → a slow page, keep
    waiting (and ping again every CHECK_AFTER_S); it does not → the handler is cancelled, and
    the 503 is the answer (unless the handler had begun answering)

The admin's MongoDB calls do not all go through the gate (a page's queries may take seconds on
a large store): this middleware is what bounds them. An error of a handler that says MongoDB
did not answer (MongoUnavailable, or a pymongo timeout or lost connection, which also closes
the gate) gets the same 503.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from enum import Enum
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse
from pymongo.errors import PyMongoError

from admin.templating import templates
from msgbus.errors import MongoUnavailable
from msgbus.http import Asgi, error_response, mongo_error_response
from msgbus.store import MongoStore
from msgbus.store.gate import MongoGate, is_outage
from msgbus.tasks import cancel_and_wait

CHECK_AFTER_S = 2.0
PING_TIMEOUT_S = 0.5
UI_PREFIX = "/ui/"


class Need(Enum):
    NOTHING = "nothing"  # never reads MongoDB
    ITS_OWN = "its own"  # reads it, but answers through an outage by itself
    MONGO = "mongo"


NO_MONGO_PATHS = frozenset({"/", "/health", "/metrics", "/ready", "/docs",
                            "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/ui/logout"})
NO_MONGO_PREFIXES = ("/ui/static/",)
NO_MONGO_ROUTES = frozenset({("GET", "/ui/login"), ("HEAD", "/ui/login"),
                             ("DELETE", "/v1/session")})
OUTAGE_AWARE_PATHS = frozenset({"/ui/dashboard", "/v1/services"})


def need_of(method: str, path: str) -> Need:
    if (path in NO_MONGO_PATHS or path.startswith(NO_MONGO_PREFIXES)
            or (method, path) in NO_MONGO_ROUTES):
        return Need.NOTHING
    return Need.ITS_OWN if path in OUTAGE_AWARE_PATHS else Need.MONGO


def outage_message(gate: MongoGate, what: str) -> str:
    state = gate.state()
    since = datetime.fromisoformat(state["since"])
    return (f"MongoDB is unavailable since {since:%H:%M:%S} UTC ({state['reason']}); "
            f"{what} needs it. Retry later.")


def unavailable_response(path: str, gate: MongoGate,
                         exc: MongoUnavailable | None = None) -> Response:
    """The 503 of a request that needs MongoDB: the gate's story while it is closed (else the
    error's), as JSON, or as a page under /ui/."""
    is_page = path.startswith(UI_PREFIX)
    if not gate.available or exc is None:
        exc = MongoUnavailable(outage_message(gate, "this page" if is_page else "this request"))
    if not is_page:
        return error_response(exc)
    html = templates.get_template("unavailable.html").render(
        message=exc.message, who=None, csrf_token="", page=None)
    return HTMLResponse(html, status_code=exc.status_code,
                        headers={"retry-after": str(exc.retry_after_s)})


async def wait_while_mongo_answers(task: asyncio.Future[Any], store: MongoStore, *,
                                   check_after_s: float = CHECK_AFTER_S,
                                   ping_timeout_s: float = PING_TIMEOUT_S) -> bool:
    """Waits for `task` as long as MongoDB answers a ping every `check_after_s`; False when it
    did not answer first (`task` is left running)."""
    while True:
        done, _ = await asyncio.wait({task}, timeout=check_after_s)
        if done:
            return True
        if not await store.ping(timeout_s=ping_timeout_s):
            return task.done()


class MongoOutageGuard:
    """Pure ASGI middleware (see the module docstring)."""

    def __init__(self, app: Asgi, *, store: MongoStore,
                 check_after_s: float = CHECK_AFTER_S) -> None:
        self._app = app
        self._store = store
        self._check_after_s = check_after_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or need_of(scope["method"], scope["path"]) is not Need.MONGO:
            await self._app(scope, receive, send)
            return
        gate = self._store.gate
        if not gate.available:
            gate.refuse("admin requests")  # counted as a skipped call
            await unavailable_response(scope["path"], gate)(scope, receive, send)
            return
        await self._bounded(scope, receive, send)

    async def _bounded(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = False

        async def send_tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        handler = asyncio.ensure_future(self._app(scope, receive, send_tracked))
        try:
            answered = await wait_while_mongo_answers(handler, self._store,
                                                      check_after_s=self._check_after_s)
        except BaseException:  # the server stops, or the client went away
            handler.cancel()
            raise
        if answered:
            handler.result()
            return
        with contextlib.suppress(Exception):  # whatever it raised, the answer is the 503
            await cancel_and_wait(handler)
        if not started:  # else the connection ends with the answer unfinished
            await unavailable_response(scope["path"], self._store.gate)(scope, receive, send)


def install_outage_handlers(app: FastAPI, gate: MongoGate) -> None:
    """MongoUnavailable, and a pymongo timeout or lost connection (which closes the gate),
    answer the 503 of `unavailable_response`; other pymongo errors as before."""

    async def _unavailable(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MongoUnavailable)
        return unavailable_response(request.url.path, gate, exc)

    async def _mongo_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PyMongoError)
        if not is_outage(exc):
            return mongo_error_response(exc)
        gate.trip("admin request", exc)
        return unavailable_response(request.url.path, gate)

    app.add_exception_handler(MongoUnavailable, _unavailable)
    app.add_exception_handler(PyMongoError, _mongo_error)
