"""A MongoDB that stops answering (a hung server, a half-open connection) makes the store's
calls fail after its socket timeout instead of waiting forever: the flushers that call it (the
dispatcher's outcomes, the receiver's records) log, back off and try again.

Found by the chaos suite: a SecantusDB restart left one of the dispatcher's pooled connections
open with a request never answered, and with no socket timeout its outcome flusher waited on it
for good; MongoDB never learned what was delivered and the compensators' sweeps pushed it all
again.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
from msgbus_devtools.testkit.tcp_gate import TcpGate
from pymongo.errors import PyMongoError

from msgbus.store import MongoStore

SOCKET_TIMEOUT_MS = 500
NEVER_S = 60  # a call still waiting after this long is taken as hung forever


async def test_a_call_to_a_mongodb_that_stopped_answering_fails(
        mongo_uri: str, mongo_db_name: str) -> None:
    server = urlsplit(mongo_uri)
    assert server.hostname and server.port
    with TcpGate(server.hostname, server.port) as gate:
        # one attempt (no retried write) so that the timeout is the only way out
        # directConnection: SecantusDB names itself a replica set member at its own address
        uri = f"mongodb://127.0.0.1:{gate.port}/?directConnection=true&retryWrites=false"
        store = MongoStore(uri, mongo_db_name, socket_timeout_ms=SOCKET_TIMEOUT_MS)
        try:
            assert await store.ping()  # a pooled connection through the gate
            gate.freeze()
            with pytest.raises(PyMongoError):
                await asyncio.wait_for(store.db.messages.insert_one({"_id": "hung"}), NEVER_S)
        finally:
            gate.thaw()
            await store.close()


def test_the_store_has_a_socket_timeout_by_default() -> None:
    store = MongoStore("mongodb://127.0.0.1:1", "unused")
    assert store._client.options.pool_options.socket_timeout is not None
