"""Listening sockets made for several processes sharing a port (SO_REUSEPORT), and a group of
servers stopped in order or together."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from msgbus.serving import ServerGroup, make_server, reuse_port_socket


async def test_connections_accepted_on_a_reuse_port_socket_do_not_wait_for_nagle() -> None:
    """Without TCP_NODELAY each response would wait ~40 ms for the client's delayed ACK."""
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    listener = reuse_port_socket("127.0.0.1", 0)
    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    try:
        _, writer = await asyncio.open_connection(*listener.getsockname())
        assert await asyncio.wait_for(accepted, 10) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_two_sockets_can_share_a_port() -> None:
    first = reuse_port_socket("127.0.0.1", 0)
    second = reuse_port_socket("127.0.0.1", first.getsockname()[1])
    first.listen()
    second.listen()
    assert first.getsockname() == second.getsockname()
    first.close()
    second.close()


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"hi"})


async def _refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


@pytest.mark.parametrize("together", [False, True])
async def test_a_stopped_group_serves_no_more(together: bool) -> None:
    group = ServerGroup()
    servers = [await group.start(make_server(_hello, "127.0.0.1", 0), f"s{i}") for i in range(3)]
    ports = [server.port for server in servers]
    await group.stop(together=together)
    assert all(server.should_exit for server in servers)
    assert [await _refused(port) for port in ports] == [True, True, True]
    await group.stop(together=together)  # a second stop has nothing left to do
