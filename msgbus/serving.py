"""Running one or several ASGI apps with uvicorn inside an event loop the caller owns.

`msgbus up` and the tests run several services in one loop; the owner handles signals and
stops the group, so the servers must not install signal handlers of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
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


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEPORT: several processes, each with such a
    socket on the same port, share its connections (the kernel spreads them over the
    processes that listen). Port 0 picks a free port; pass the bound port to the others."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it every response waits ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


class ServerGroup:
    """Starts servers in order (each must be up before the next starts) and stops them in
    reverse order."""

    def __init__(self) -> None:
        self._running: list[tuple[EmbeddedServer, asyncio.Task[None]]] = []

    async def start(self, server: EmbeddedServer, name: str,
                    sockets: list[socket.socket] | None = None) -> EmbeddedServer:
        """`sockets`: listen on these (e.g. from `reuse_port_socket`) instead of binding the
        server's configured host and port."""
        task = asyncio.create_task(server.serve(sockets=sockets), name=f"serve-{name}")
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

    async def stop(self, *, together: bool = False) -> None:
        """The last started first, each after the one before stopped; `together`: all at
        once, for servers that do not depend on each other (a uvicorn server takes ~0.2 s to
        stop, so a test's dozens of subscribers took seconds one after the other)."""
        running, self._running = list(reversed(self._running)), []
        if together:
            for server, _ in running:
                server.should_exit = True
            await asyncio.gather(*(task for _, task in running), return_exceptions=True)
            return
        for server, task in running:
            server.should_exit = True
            with contextlib.suppress(Exception, SystemExit, asyncio.CancelledError):
                await task
