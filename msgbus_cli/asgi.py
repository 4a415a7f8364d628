"""The few raw-ASGI pieces that tiny HTTP endpoints (the demo subscriber, test and benchmark
subscribers) share. Raw ASGI because a subscriber should cost the bus's figures nothing."""

from __future__ import annotations

from typing import Any

Receive = Any
Send = Any


async def answer_lifespan(scope: dict[str, Any], receive: Receive, send: Send) -> bool:
    """Handle a lifespan scope (startup and shutdown do nothing); True if it was one."""
    if scope["type"] != "lifespan":
        return False
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
    return True


async def read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        event = await receive()
        body += event.get("body", b"")
        if not event.get("more_body"):
            return body


async def read_request(scope: dict[str, Any], receive: Receive,
                       send: Send) -> tuple[dict[str, str], bytes] | None:
    """An HTTP request's headers and body; None for a lifespan scope (answered here)."""
    if await answer_lifespan(scope, receive, send):
        return None
    return request_headers(scope), await read_body(receive)


def request_headers(scope: dict[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def respond(send: Send, status: int, body: bytes = b"",
                  content_type: bytes = b"text/plain") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type)]})
    await send({"type": "http.response.body", "body": body})
