"""The admin's MongoDB outage middleware (admin/outage.py) over a stand-in app and store: what
needs MongoDB answers 503 at once while the gate is closed, a hung handler is cut off once a
ping finds MongoDB gone, a slow one that MongoDB still answers for is waited for; where a
service advertises its /health, and how the admin's Services panel reads them
(admin/services.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pymongo.errors import NetworkTimeout, OperationFailure
from starlette.responses import PlainTextResponse

from admin.outage import MongoOutageGuard, Need, install_outage_handlers, need_of
from admin.services import ServiceDirectory
from msgbus.settings import ConnectionSettings
from msgbus.store import MongoStore
from msgbus.store.gate import MongoGate

CHECK_AFTER_S = 0.2


class FakeStore:
    """A store whose ping answers `answers` (False also closes the gate, as a real one's)."""

    def __init__(self) -> None:
        self.answers = True
        self.pings = 0
        self.gate = MongoGate(self._probe, component="test-admin", probe_first_s=60)

    async def _probe(self) -> None:
        raise ConnectionError("still down")

    async def ping(self, timeout_s: float = 1.0) -> bool:
        self.pings += 1
        if not self.answers:
            self.gate.trip("ping", TimeoutError("no answer"))
        return self.answers


def app_taking(seconds: float) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await asyncio.sleep(seconds)
        await PlainTextResponse("done")(scope, receive, send)

    return app


async def call(store: FakeStore, app: Any, path: str) -> tuple[httpx.Response, float]:
    guard = MongoOutageGuard(app, store=store, check_after_s=CHECK_AFTER_S)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guard),
                                 base_url="http://admin") as client:
        began = time.monotonic()
        response = await client.get(path)
        return response, time.monotonic() - began


@pytest.fixture
async def store() -> Any:
    made = FakeStore()
    yield made
    await made.gate.close()


@pytest.mark.parametrize(("method", "path", "need"), [
    ("GET", "/health", Need.NOTHING), ("GET", "/ui/static/ui.css", Need.NOTHING),
    ("GET", "/openapi.json", Need.NOTHING), ("GET", "/ui/login", Need.NOTHING),
    ("POST", "/ui/login", Need.MONGO), ("GET", "/v1/destinations", Need.MONGO),
    ("GET", "/ui/dashboard", Need.ITS_OWN), ("GET", "/v1/services", Need.ITS_OWN)])
def test_admin_outage_knows_what_needs_mongodb(method: str, path: str, need: Need) -> None:
    assert need_of(method, path) is need


async def test_admin_outage_answers_503_at_once_while_the_gate_is_closed(
        store: FakeStore) -> None:
    store.gate.trip("earlier call", TimeoutError("hung"))
    api, took = await call(store, app_taking(30), "/v1/destinations")
    assert api.status_code == 503 and took < 1
    assert api.headers["retry-after"] == "2"
    body = api.json()
    assert body["error"] == "mongo_unavailable"
    assert body["message"].startswith("MongoDB is unavailable since ")
    assert "TimeoutError: hung" in body["message"] and "this request needs it" in body["message"]

    page, _ = await call(store, app_taking(30), "/ui/destinations")
    assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
    assert "this page needs it" in page.text and 'id="mongo-unavailable"' in page.text

    health, _ = await call(store, app_taking(0), "/health")
    assert health.status_code == 200


async def test_admin_outage_cuts_off_a_hung_handler_once_mongodb_stops_answering(
        store: FakeStore) -> None:
    store.answers = False
    response, took = await call(store, app_taking(30), "/v1/messages")
    assert response.status_code == 503 and response.json()["error"] == "mongo_unavailable"
    assert CHECK_AFTER_S <= took < 2 and store.pings == 1
    assert not store.gate.available


async def test_admin_outage_waits_for_a_slow_page_while_mongodb_answers(
        store: FakeStore) -> None:
    response, took = await call(store, app_taking(5 * CHECK_AFTER_S), "/v1/messages")
    assert response.status_code == 200 and response.text == "done"
    assert store.pings >= 3 and took >= 5 * CHECK_AFTER_S


def test_a_service_advertises_its_health_where_it_listens() -> None:
    conn = ConnectionSettings()
    assert conn.health_url("127.0.0.1", 8081) == "http://127.0.0.1:8081/health"
    assert conn.health_url("127.0.0.1", 0) is None  # known once bound
    assert conn.health_url("0.0.0.0", 8081) not in (None, "http://0.0.0.0:8081/health")
    pod = ConnectionSettings(advertised_host="10.1.2.3")
    assert pod.health_url("0.0.0.0", 8080) == "http://10.1.2.3:8080/health"
    assert ConnectionSettings(advertised_host="fd00::1").health_url("::", 8080) == \
        "http://[fd00::1]:8080/health"


async def test_admin_services_reads_each_health_and_marks_what_it_cannot_reach() -> None:
    """The last list read from `instances` (MongoDB itself is not reached here: the admin's
    gate is closed), each /health answered by a stand-in."""
    down = {"available": False, "since": "2026-01-01T10:00:00+00:00", "closed_by": "claims",
            "reason": "NetworkTimeout: timed out"}
    answers = {
        "http://r:1/health": {"mongo_gate": {"available": True}, "flusher": {
            "mode": "process", "pid": 7, "mongo_gate": down}},
        # a receiver from before 0.2 called its flusher "drainer"
        "http://o:1/health": {"mongo_gate": {"available": True}, "drainer": {"mode": "inline"}},
        "http://d:1/health": {"mongo_gate": {"available": True}},
    }

    def health(request: httpx.Request) -> httpx.Response:
        found = answers.get(str(request.url))
        if found is None:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=found)

    store = MongoStore("mongodb://127.0.0.1:1", "unused")
    directory = ServiceDirectory(store, own_instance="admin:me", own_health_url=None)
    await directory._http.aclose()
    directory._http = httpx.AsyncClient(transport=httpx.MockTransport(health))
    directory._instances = {
        "dispatcher:d": {"_id": "dispatcher:d", "component": "dispatcher",
                         "health_url": "http://d:1/health"},
        "receiver:r": {"_id": "receiver:r", "component": "receiver",
                       "health_url": "http://r:1/health"},
        "receiver:o": {"_id": "receiver:o", "component": "receiver",
                       "health_url": "http://o:1/health"},
        "compensator:gone": {"_id": "compensator:gone", "component": "compensator",
                             "health_url": "http://gone:1/health"},
        "compensator:old": {"_id": "compensator:old", "component": "compensator"},
        "admin:me": {"_id": "admin:me", "component": "admin", "health_url": "http://me/health"},
    }
    store.gate.trip("test", TimeoutError("hung"))
    try:
        answer = await directory.status()
    finally:
        await directory.close()
        await store.close()
    rows = {row["instance"]: row for row in answer["services"]}
    assert [row["component"] for row in answer["services"]] == [
        "receiver", "receiver", "dispatcher", "compensator", "compensator", "admin"]
    assert rows["receiver:r"]["flusher"] == {"mode": "process", "pid": 7, "mongo": down}
    assert rows["receiver:o"]["flusher"] == {"mode": "inline", "pid": None, "mongo": None}
    assert rows["admin:me"]["this_admin"] and rows["admin:me"]["mongo"]["available"] is False
    assert answer["unavailable"] == ["receiver:r", "admin:me"]
    assert answer["unreachable"] == ["compensator:gone"]
    assert "ConnectError" in rows["compensator:gone"]["error"]
    assert rows["compensator:old"]["reachable"] is None
    assert rows["compensator:old"]["error"] == "no health URL advertised"


async def test_admin_a_mongodb_timeout_in_a_request_is_the_503_not_a_500(
        store: FakeStore) -> None:
    app = FastAPI()
    install_outage_handlers(app, store.gate)

    @app.get("/v1/hung")
    async def hung() -> None:
        raise NetworkTimeout("127.0.0.1:27017: timed out")

    @app.get("/ui/refused")
    async def refused() -> None:
        raise OperationFailure("not authorized")

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://admin") as client:
        timed_out = await client.get("/v1/hung")
        assert timed_out.status_code == 503 and timed_out.json()["error"] == "mongo_unavailable"
        assert "NetworkTimeout" in timed_out.json()["message"]
        assert not store.gate.available  # the next requests get the 503 at once
        other = await client.get("/ui/refused")  # not an outage: the plain MongoDB error
        assert other.status_code == 503 and other.json()["error"] == "unavailable"
