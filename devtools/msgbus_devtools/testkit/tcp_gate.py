"""`TcpGate`: a TCP forwarder on 127.0.0.1 that a test opens and closes, to put a real service
"down" and back "up" without stopping it.

Open: every connection is forwarded, byte for byte, to the target. Closed: new connections are
accepted and reset at once (the client sees a connection error), and closing the gate resets
every connection it is forwarding, so kept-alive client connections fail too. Frozen: every
connection stays open but no byte moves, as with a peer that hangs (until `thaw()`).
It runs its own asyncio loop on a background thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

HOST = "127.0.0.1"
_CHUNK = 64 * 1024
T = TypeVar("T")


class TcpGate:
    def __init__(self, target_host: str, target_port: int, *, open_: bool = True) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.refused = 0  # connections reset because the gate was closed
        self.forwarded = 0  # connections forwarded to the target
        self._open = open_
        self._active: set[asyncio.WriteTransport] = set()
        self._flowing = asyncio.Event()  # cleared while frozen
        self._flowing.set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-gate",
                                        daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def is_open(self) -> bool:
        return self._open

    def start(self) -> TcpGate:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._handle, HOST, 0))
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def open(self) -> None:
        self._open = True

    def freeze(self) -> None:
        """Keep every connection open but move no more bytes either way."""
        self._call(self._flow(False))

    def thaw(self) -> None:
        self._call(self._flow(True))

    async def _flow(self, flowing: bool) -> None:
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    def close(self) -> None:
        """Refuse new connections and reset the ones being forwarded."""
        self._open = False
        self._call(self._reset_active())

    def __enter__(self) -> TcpGate:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._server is not None:
            self._call(self._shut(self._server))  # asyncio objects belong to the gate's loop
            self._server = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _shut(self, server: asyncio.Server) -> None:
        server.close()
        await self._reset_active()

    async def _reset_active(self) -> None:
        for transport in list(self._active):
            transport.abort()
        self._active.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = writer.transport
        if not self._open:
            self.refused += 1
            client.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client.abort()
            return
        self.forwarded += 1
        upstream = up_writer.transport
        pair = {client, upstream}
        self._active |= pair
        try:
            await asyncio.gather(_pipe(reader, up_writer, self._flowing),
                                 _pipe(up_reader, writer, self._flowing))
        finally:
            for transport in pair:
                transport.abort()
            self._active -= pair


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                flowing: asyncio.Event) -> None:
    """Copy (while `flowing` is set) until EOF or an error, then close both ends of this
    direction."""
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(_CHUNK):
            await flowing.wait()
            writer.write(data)
            await writer.drain()
    writer.transport.abort()


def mongo_uri_through(gate: TcpGate) -> str:
    """A MongoDB URI whose connections go through `gate` (directConnection: SecantusDB names
    itself a replica set member at its own address, which is not the gate's)."""
    return f"mongodb://{HOST}:{gate.port}/?directConnection=true"
