"""Shared FastAPI plumbing: the app of a service, JSON errors from the error hierarchy (their
description in the OpenAPI document is in `msgbus.apidoc`), the /metrics response and request
timing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Protocol

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import Histogram
from pymongo.errors import PyMongoError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from msgbus import __version__, metrics
from msgbus.apidoc import describe_in_openapi
from msgbus.errors import MsgbusError, Unavailable


def install_error_handlers(
    app: FastAPI, *, on_error: Callable[[MsgbusError], None] | None = None
) -> None:
    """Every error answers JSON `{"error", "message", "field"?}`; 503s carry Retry-After."""

    @app.exception_handler(MsgbusError)
    async def _bus_error(_: Request, exc: MsgbusError) -> JSONResponse:
        if on_error is not None:
            on_error(exc)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        each = [{"field": _field_of(e), "message": str(e.get("msg", "invalid"))}
                for e in exc.errors()[:MAX_FIELD_ERRORS]]
        first = each[0] if each else {"field": None, "message": "invalid request"}
        body = {"error": "invalid_input", **first, "errors": each}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(PyMongoError)
    async def _mongo_down(_: Request, exc: PyMongoError) -> JSONResponse:
        return mongo_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:
            headers = {**(headers or {}), "allow": allowed_methods(request)}
        return JSONResponse({"error": "http_error", "message": str(exc.detail)},
                            status_code=exc.status_code, headers=headers)


MAX_FIELD_ERRORS = 50


def _field_of(error: Any) -> str | None:
    """`a.b.0` for a body field, the name for a query parameter or header (`loc` begins with
    where it was: body, query, header)."""
    return ".".join(str(p) for p in error.get("loc", ())[1:]) or None


def allowed_methods(request: Request) -> str:
    """The Allow header of a 405: the methods of every route of the request's path. Starlette
    names only those of the first route that matched the path, when several routes serve it
    (GET and POST /v1/apps are two routes)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


def include_routes(app: FastAPI, router: APIRouter) -> None:
    """Adds the router's routes to the app's own list, as `app.get` and the like would.
    `app.include_router` (FastAPI 0.165) adds the router as one entry instead, whose routes'
    methods `allowed_methods` does not see: a 405's Allow header would miss them."""
    app.router.routes.extend(router.routes)


def retry_after(exc: MsgbusError) -> dict[str, str]:
    """The Retry-After header of an error that says when to try again (none if it does not)."""
    return {} if exc.retry_after_s is None else {"retry-after": str(exc.retry_after_s)}


def error_response(exc: MsgbusError) -> JSONResponse:
    headers = retry_after(exc) or None
    return JSONResponse(exc.to_json(), status_code=exc.status_code, headers=headers)


def mongo_error_response(exc: PyMongoError) -> JSONResponse:
    return error_response(Unavailable(f"MongoDB is unavailable: {type(exc).__name__}"))


# An ASGI app: (scope, receive, send)
Asgi = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
# A lean endpoint's work: (scope, receive) -> (status, JSON body)
LeanHandler = Callable[[dict[str, Any], Any], Awaitable[tuple[int, bytes]]]
_JSON_HEADER = (b"content-type", b"application/json")


class LeanEndpoint:
    """A hot endpoint as a plain ASGI app, without FastAPI's per-request machinery (dependency
    solving, Request and Headers objects, the exception middleware): `handle` reads what it
    needs from the ASGI scope and returns (status, JSON body). It answers the MsgbusError and
    PyMongoError families itself, exactly as install_error_handlers does (without its
    `on_error` hook); any other exception escapes, as from a FastAPI route.

    Mount it with starlette.routing.Route (a class instance is passed the request as it is),
    and let RequestTimer(lean_route=...) call it directly for the fastest path."""

    __slots__ = ("_handle",)

    def __init__(self, handle: LeanHandler) -> None:
        self._handle = handle

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            status, body = await self._handle(scope, receive)
        except MsgbusError as exc:
            await error_response(exc)(scope, receive, send)
            return
        except PyMongoError as exc:
            await mongo_error_response(exc)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), _JSON_HEADER]})
        await send({"type": "http.response.body", "body": body})


def metrics_response() -> Response:
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)


class Lifecycle(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


def service_app(
    title: str, service: Lifecycle, *, on_error: Callable[[MsgbusError], None] | None = None,
    before_metrics: Callable[[], object] | None = None,
) -> FastAPI:
    """A service's FastAPI app: starts and closes `service` with the server, answers errors
    as JSON (its OpenAPI document says which, `describe_errors`, and links its operations,
    `describe_links`) and serves /metrics (after `before_metrics` refreshes any gauges)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title=title, version=__version__, lifespan=lifespan)
    install_error_handlers(app, on_error=on_error)
    describe_in_openapi(app)

    @app.get("/metrics", include_in_schema=False)
    async def _metrics() -> Response:
        if before_metrics is not None:
            before_metrics()
        return metrics_response()

    return app


ReadinessChecks = Callable[[], Awaitable[dict[str, bool]]]


def add_readiness(app: FastAPI, checks: ReadinessChecks, *, required: Iterable[str],
                  service: str) -> None:
    """GET /ready: 200 when every `required` check of `checks()` passes, else 503 (Kubernetes
    then sends the pod no traffic). The other checks are only shown. /health stays the liveness
    probe: it answers while the event loop does, whatever the dependencies do (restarting a pod
    never brings MongoDB back). A "mongo" check also sets msgbus_mongo_up{service}."""
    must_pass = frozenset(required)

    @app.get("/ready", include_in_schema=False)
    async def _ready() -> JSONResponse:
        found = await checks()
        if "mongo" in found:
            metrics.MONGO_UP.labels(service).set(1 if found["mongo"] else 0)
        ready = all(found.get(name, False) for name in must_pass)
        return JSONResponse({"ready": ready, "checks": found,
                             "required": sorted(must_pass)}, status_code=200 if ready else 503)


class ServerTiming:
    """Pure ASGI middleware: every HTTP answer carries `server-timing: app;dur=<ms>`, the time
    from the request's arrival to its answer's headers (for a rendered page, the whole work:
    queries and template), which browsers' developer tools and benchmarks read without the
    network's share."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()

        async def send_timed(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                took = (time.perf_counter() - started) * 1000
                message["headers"] = [*message.get("headers", ()),
                                      (b"server-timing", f"app;dur={took:.1f}".encode())]
            await send(message)

        await self._app(scope, receive, send_timed)


class RequestTimer:
    """Pure ASGI middleware that observes `histogram` (labels: endpoint, status class) for the
    requests whose path `endpoint_of` maps to an endpoint name; other requests pass untouched.
    Pure ASGI because BaseHTTPMiddleware costs a hot path far more than these few microseconds.

    `lean_route(scope, endpoint)` may name an ASGI app (a LeanEndpoint) for a timed request:
    it is called right here, skipping the exception middleware and the router below (which
    must route the same request to the same app: the lean route is only a shortcut).
    """

    def __init__(self, app: Any, *, histogram: Histogram,
                 endpoint_of: Callable[[str], str | None],
                 lean_route: Callable[[dict[str, Any], str], Asgi | None] | None = None,
                 ) -> None:
        self._app = app
        self._histogram = histogram
        self._endpoint_of = endpoint_of
        self._lean_route = lean_route
        self._children: dict[tuple[str, int], Any] = {}  # labels() takes a lock: cache them

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        endpoint = self._endpoint_of(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            await self._app(scope, receive, send)
            return
        app = self._app
        if self._lean_route is not None:
            app = self._lean_route(scope, endpoint) or app
        status = 500  # what the server answers when an exception escapes

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        try:
            await app(scope, receive, send_status)
        finally:
            self._observe(endpoint, status // 100, time.perf_counter() - started)

    def _observe(self, endpoint: str, status_class: int, seconds: float) -> None:
        child = self._children.get((endpoint, status_class))
        if child is None:
            child = self._histogram.labels(endpoint, f"{status_class}xx")
            self._children[(endpoint, status_class)] = child
        child.observe(seconds)
