"""The "bare endpoint" of `python -m bench.ingest`: the receiver's two POST routes on FastAPI,
doing nothing but parsing the same JSON into pydantic models and answering like the receiver.

    python -m bench.bare_app --port PORT [--reuse-port]

It runs under the same uvicorn settings as the receiver (`msgbus.serving.make_server`: uvloop,
httptools, no access log); `--reuse-port` lets several processes share the port (SO_REUSEPORT),
like `msgbus receiver --workers N`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

HOST = "127.0.0.1"


class Message(BaseModel):
    message_id: str
    biz_id: str | None = None
    created_at: str | None = None
    headers: dict[str, str] | None = None
    body: Any = None


class BatchMessage(Message):
    destination: str


class Batch(BaseModel):
    messages: list[BatchMessage]


def create_app() -> FastAPI:
    app = FastAPI(title="bare endpoint")

    @app.post("/v1/destinations/{code}/messages", status_code=202)
    async def send_one(code: str, message: Message) -> dict[str, str]:
        return {"message_id": message.message_id, "status": "accepted"}

    @app.post("/v1/messages")
    async def send_batch(batch: Batch) -> dict[str, Any]:
        return {"results": [{"message_id": m.message_id, "status": 202, "error": None}
                            for m in batch.messages]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def serve(port: int, reuse_port: bool) -> None:
    from msgbus.serving import make_server, reuse_port_socket

    server = make_server(create_app(), HOST, port)  # the receiver's uvicorn settings
    sockets = [reuse_port_socket(HOST, port)] if reuse_port else None

    def should_exit() -> None:
        server.should_exit = True

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, should_exit)
    loop.add_signal_handler(signal.SIGINT, should_exit)
    await server.serve(sockets=sockets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reuse-port", action="store_true")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.reuse_port))


if __name__ == "__main__":
    main()
