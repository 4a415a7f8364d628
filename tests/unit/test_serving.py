"""Listening sockets made for several processes sharing a port (SO_REUSEPORT)."""

from __future__ import annotations

import asyncio
import socket

from msgbus.cli.serving import reuse_port_socket


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
