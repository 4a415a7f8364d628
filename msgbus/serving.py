"""Running one or several ASGI apps with uvicorn inside an event loop the caller owns.

`msgbus up` and the tests run several services in one loop; the owner handles signals and
stops the group, so the servers must not install signal handlers of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator
from typing import Any

import uvicorn

log = logging.getLogger(__name__)


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self.servers[0].sockets[0].getsockname()[1])


def make_server(app: Any, host: str, port: int, *, log_level: str = "warning") -> EmbeddedServer:
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            lifespan="on", timeout_graceful_shutdown=10)
    return EmbeddedServer(config)


class ServerGroup:
    """Starts servers in order (each must be up before the next starts) and stops them in
    reverse order."""

    def __init__(self) -> None:
        self._running: list[tuple[EmbeddedServer, asyncio.Task[None]]] = []

    async def start(self, server: EmbeddedServer, name: str) -> EmbeddedServer:
        task = asyncio.create_task(server.serve(), name=f"serve-{name}")
        while not server.started:
            if task.done():
                exc = task.exception()
                raise RuntimeError(f"{name} failed to start: {exc!r}") from exc
            await asyncio.sleep(0.02)
        self._running.append((server, task))
        return server

    async def wait_any_exit(self) -> None:
        if self._running:
            await asyncio.wait([t for _, t in self._running], return_when=asyncio.FIRST_COMPLETED)

    async def stop(self) -> None:
        for server, task in reversed(self._running):
            server.should_exit = True
            with contextlib.suppress(Exception, SystemExit, asyncio.CancelledError):
                await task
        self._running.clear()
