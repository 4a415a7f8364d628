"""Shared FastAPI plumbing: the app of a service, JSON errors from the error hierarchy and the
/metrics response."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pymongo.errors import PyMongoError
from starlette.exceptions import HTTPException as StarletteHTTPException

from msgbus import __version__, metrics
from msgbus.errors import MsgbusError, Unavailable


def install_error_handlers(
    app: FastAPI, *, on_error: Callable[[MsgbusError], None] | None = None
) -> None:
    """Every error answers JSON `{"error", "message", "field"?}`; 503s carry Retry-After."""

    @app.exception_handler(MsgbusError)
    async def _bus_error(_: Request, exc: MsgbusError) -> JSONResponse:
        if on_error is not None:
            on_error(exc)
        headers = {"retry-after": "1"} if isinstance(exc, Unavailable) else None
        return JSONResponse(exc.to_json(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        body = {"error": "invalid_input", "message": str(first.get("msg", "invalid request")),
                "field": field}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(PyMongoError)
    async def _mongo_down(_: Request, exc: PyMongoError) -> JSONResponse:
        body = {"error": "unavailable", "message": f"MongoDB is unavailable: {type(exc).__name__}"}
        return JSONResponse(body, status_code=503, headers={"retry-after": "1"})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": "http_error", "message": str(exc.detail)},
                              status_code=exc.status_code, headers=exc.headers)


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
    as JSON and serves /metrics (after `before_metrics` refreshes any gauges)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title=title, version=__version__, lifespan=lifespan)
    install_error_handlers(app, on_error=on_error)

    @app.get("/metrics", include_in_schema=False)
    async def _metrics() -> Response:
        if before_metrics is not None:
            before_metrics()
        return metrics_response()

    return app
