"""Every service's API under schemathesis, on real servers: the receiver, admin, dispatcher and
compensator of a bus of this module's own (the fuzzer changes runtime settings, deletes users and
revokes keys, which would break other tests on the session's bus). Each runs `st run` with the
coverage, fuzzing and stateful phases and every check: no 5xx, no status, header or body the
OpenAPI document does not describe, no schema-valid request refused and no invalid one accepted.
Each document is valid OpenAPI and describes the errors its service answers.

A failure prints schemathesis' report: each case with a curl command that reproduces it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import schemathesis
from msgbus_devtools.testkit.bus import RunningBus, StartBus
from msgbus_devtools.testkit.subscriber import RecordingSubscriber

SERVICES = ("receiver", "admin", "dispatcher", "compensator")
PHASES = "coverage,fuzzing,stateful"
MAX_EXAMPLES = 12  # per operation and phase (20 took 36-48 s for the admin alone in the suite)
REQUEST_TIMEOUT_S = 10  # a request unanswered by then is a failure: no hangs
RUN_TIMEOUT_S = 240  # a run that hangs fails with what it printed so far
ST = [sys.executable, "-m", "schemathesis.cli"]
DESTINATION = "fuzz-dest"  # a real destination: half the ingest requests go there
# schemathesis' default statuses of a schema-valid request (positive_data_acceptance)
ACCEPTED_STATUSES = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]

# Per service, operation name -> ...
Lists = dict[str, dict[str, dict[str, str]]]

# Rules of an operation that its OpenAPI document cannot state (JSON Schema has no "after the
# other field", no header required with one media type only): a schema-valid request that
# breaks one is refused with this status. -> {status: the rule}
RULES_BEYOND_THE_DOCUMENT: Lists = {
    "receiver": {"POST /v1/destinations/{code}/messages": {
        "415": "a raw message (a Content-Type but JSON) needs the ce-id header",
        "422": "the ce-* headers go with a raw message only, not a JSON envelope; "
               "deliver_at and ce-deliverat / ce-delayseconds at most 30 days ahead"}},
    "admin": {
        "POST /v1/replays": {"422": "until must be after since"},
        "GET /v1/messages": {"400": "before / after is a cursor the list handed out "
                                    "(x-next-cursor, x-previous-cursor) or a time: opaque"},
        "PATCH /v1/runtime": {"422": "an active cluster is one the admin's settings configure "
                                     "(GET /v1/runtime lists them)"},
        "PUT /v1/destinations/{code}/subscriptions/{name}": {
            "422": "the url is at most 2,083 characters also in the form it is stored in "
                   "(percent-encoded, '/' after a bare host); max_in_flight is at least "
                   "batch_max_messages"},
        "PUT /v1/teams/{team}": {
            "422": "the notify_url is at most 2,083 characters also in the form it is stored "
                   "in"},
        "POST /v1/destinations/{code}/subscription-requests": {
            "422": "its settings keep the rules of a subscription's (PUT above)"},
        "PUT /v1/users/{name}": {"400": "a new user needs a password and a role; a change "
                                        "does not"},
        "PUT /v1/destinations/{code}/schemas": {
            "422": "the schema is a valid JSON Schema of draft 2020-12 (its metaschema, which "
                   "the document does not repeat)"}},
    "dispatcher": {"POST /internal/v1/deliveries": {
        "422": "the bytes are a batch of envelopes as msgbus.codec.encode_batch writes it"}},
}

# The checks that do not apply to an operation. -> {check: why}
CHECKS_NOT_MEANINGFUL: Lists = {
    "receiver": {"POST /v1/messages": {
        "negative_data_rejection": "a batch answers 200 with a verdict per message: an "
                                   "invalid message is refused in its result"}},
}


@dataclass
class Target:
    """A service to fuzz: its URL, the Authorization header of its requests, and more of the
    schemathesis configuration (tables, and operation name -> its settings)."""

    url: str
    authorization: str | None
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def fuzz_bus(start_bus: StartBus) -> Iterator[RunningBus]:
    with start_bus("fuzz") as running:
        yield running


def _user_token(bus: RunningBus) -> str:
    """An API token of an admin user: the bootstrap token has no user to make tokens for."""
    name, password = "fuzz-admin", "fuzz-admin-password"
    bus.admin.put(f"/v1/users/{name}", json={"password": password, "role": "admin"}
                  ).raise_for_status()
    with httpx.Client(base_url=bus.admin_url, timeout=10) as client:
        session = client.post("/v1/session", json={"username": name, "password": password})
        session.raise_for_status()
        created = client.post("/v1/tokens", json={"name": "fuzz"},
                              headers={"x-csrf-token": session.json()["csrf_token"]})
        created.raise_for_status()
    return str(created.json()["token"])


def _operation_settings(service: str, more: dict[str, dict[str, Any]] | None = None
                        ) -> dict[str, dict[str, Any]]:
    """Operation name -> its schemathesis settings: from the lists above, and `more`."""
    settings: dict[str, dict[str, Any]] = {}
    for operation, rules in RULES_BEYOND_THE_DOCUMENT.get(service, {}).items():
        settings.setdefault(operation, {})[
            "checks.positive_data_acceptance.expected-statuses"] = [*ACCEPTED_STATUSES, *rules]
    for operation, checks in CHECKS_NOT_MEANINGFUL.get(service, {}).items():
        for check in checks:
            settings.setdefault(operation, {})[f"checks.{check}.enabled"] = False
    for operation, values in (more or {}).items():
        settings.setdefault(operation, {}).update(values)
    return settings


def _half_to_the_destination(*parameters: str) -> dict[str, dict[str, Any]]:
    """Random destination codes are all unknown: half of these parameters' values name the
    real destination instead, so that requests get past the 404."""
    return {"dictionaries.destinations": {"values": [DESTINATION]},
            "parameters": {parameter: {"dictionary": "destinations", "probability": 0.5}
                           for parameter in parameters}}


@pytest.fixture(scope="module")
def targets(fuzz_bus: RunningBus) -> dict[str, Target]:
    bus = fuzz_bus
    bus.create_destination(DESTINATION, "direct")
    # a subscription, for the replays of the admin's stateful phase
    bus.subscribe(DESTINATION, "fuzz-sub", bus.serve_subscriber(RecordingSubscriber()))
    user_token: dict[str, Any] = {"headers": {"Authorization": f"Bearer {_user_token(bus)}"}}
    # Not the names GET /v1/users answers: the fuzzer would delete the token's user.
    unseen_users: dict[str, Any] = {
        f"phases.{phase}.extra-data-sources.responses": False for phase in ("coverage", "fuzzing")}
    admin = {"POST /v1/tokens": user_token, "DELETE /v1/tokens/{token_id}": user_token,
             "PUT /v1/users/{name}": unseen_users, "DELETE /v1/users/{name}": unseen_users}
    internal_token = bus.connections.internal_token.get_secret_value()
    return {
        "receiver": Target(
            bus.receiver_url, f"Bearer {bus.create_app('fuzz-producer')}",
            tables=_half_to_the_destination("path.code", "body.messages[*].destination"),
            operations=_operation_settings("receiver")),
        # schemathesis checks every operation with wrong credentials, from one address: more
        # than enough to lock it out (test_signin_throttle.py tests that)
        "admin": Target(
            bus.start_admin(signin_address_lock_after=1_000_000), f"Bearer {bus.admin_token}",
            tables=_half_to_the_destination("body.destination"),  # a replay's
            operations=_operation_settings("admin", admin)),
        "dispatcher": Target(bus.dispatcher_url, f"Bearer {internal_token}",
                             operations=_operation_settings("dispatcher")),
        "compensator": Target(bus.compensator_url, None,
                              operations=_operation_settings("compensator")),
    }


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value)  # strings, numbers and lists of them: JSON is TOML there


def schemathesis_toml(target: Target) -> str:
    """The run's schemathesis.toml: the Authorization header goes there, not on the command
    line, so that an operation's own header (the admin's token routes) overrides it."""
    lines = []
    if target.authorization is not None:
        lines.append(f"headers = {_toml_value({'Authorization': target.authorization})}")
    for table, values in target.tables.items():
        lines.append(f"[{table}]")
        lines += [f"{json.dumps(key)} = {_toml_value(value)}" for key, value in values.items()]
    for operation, settings in target.operations.items():
        lines += ["[[operations]]", f"include-name = {json.dumps(operation)}"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("service", SERVICES)
def test_the_api_keeps_to_its_document_under_fuzzing(
        targets: dict[str, Target], service: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    target = targets[service]
    config = tmp_path / "schemathesis.toml"
    config.write_text(schemathesis_toml(target))
    command = [*ST, "--config-file", str(config), "run", f"{target.url}/openapi.json",
               "--phases", PHASES, "--max-examples", str(MAX_EXAMPLES),
               "--request-timeout", str(REQUEST_TIMEOUT_S), "--workers", "1", "--no-color"]
    began = time.monotonic()
    try:  # in tmp_path: schemathesis keeps a cache of the failures it found in .schemathesis/
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:  # its output is bytes, whatever `text` says
        printed = b"\n".join(out for out in (exc.stdout, exc.stderr) if isinstance(out, bytes))
        pytest.fail(f"schemathesis ran over {RUN_TIMEOUT_S} s:\n{printed.decode()}")
    with capsys.disabled():
        print(f"\n[fuzz] {service}: {time.monotonic() - began:.1f} s")
    assert run.returncode == 0, f"{' '.join(command)}\n{config.read_text()}\n" \
                                f"{run.stdout}\n{run.stderr}"


def _document(target: Target) -> Any:
    schema = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    schema.validate()  # against the OpenAPI 3.1 meta-schema
    return schema.raw_schema


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield f"{method.upper()} {path}", operation


def _resolve(document: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    ref = response.get("$ref")
    if ref is None:
        return response
    *_, kind, name = ref.split("/")
    return dict(document["components"][kind][name])


@pytest.mark.parametrize("service", SERVICES)
def test_each_document_is_valid_and_describes_the_errors(
        targets: dict[str, Target], service: str) -> None:
    document = _document(targets[service])
    assert "/metrics" not in document["paths"] and "/ready" not in document["paths"]
    error = {"$ref": "#/components/schemas/Error"}
    for name, operation in _operations(document):
        responses = {status: _resolve(document, r)
                     for status, r in operation["responses"].items()}
        for status, response in responses.items():
            if status[0] in "45":
                assert response["content"]["application/json"]["schema"] == error, name
        if "503" in responses:
            assert "Retry-After" in responses["503"]["headers"], name
        if operation.get("security"):
            assert "401" in responses, name
        if operation.get("parameters") or "requestBody" in operation:
            assert "422" in responses or "400" in responses, name
    assert "HTTPValidationError" not in document["components"].get("schemas", {})


def test_the_receiver_describes_its_ingest_endpoints(targets: dict[str, Target]) -> None:
    document = _document(targets["receiver"])
    assert document["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    for path, statuses in {
            "/v1/destinations/{code}/messages": {"202", "400", "401", "403", "404", "413",
                                                 "415", "422", "429", "503"},
            "/v1/messages": {"200", "400", "401", "413", "415", "429", "503"}}.items():
        operation = document["paths"][path]["post"]
        assert set(operation["responses"]) == statuses
        assert operation["security"] == [{"bearerAuth": []}]


def test_the_admin_links_its_operations(targets: dict[str, Target]) -> None:
    """The chains the stateful phase walks: what a write creates is used next."""
    document = dict(_operations(_document(targets["admin"])))

    by_id = {operation["operationId"]: name for name, operation in document.items()}

    def targets_of(operation: str) -> dict[str, dict[str, str]]:
        """Where the links of `operation`'s success go: operation name -> link parameters."""
        responses = document[operation]["responses"]
        success = next(status for status in responses if status.startswith("2"))
        return {by_id[link["operationId"]]: link["parameters"]
                for link in responses[success].get("links", {}).values()}

    assert targets_of("PUT /v1/destinations/{code}")[
        "PUT /v1/destinations/{code}/subscriptions/{name}"] == {"code": "$request.path.code"}
    replay = {"replay_id": "$response.body#/replay_id"}
    assert targets_of("POST /v1/replays")["GET /v1/replays/{replay_id}"] == replay
    assert targets_of("POST /v1/replays")["POST /v1/replays/{replay_id}/{action}"] == replay
    assert targets_of("POST /v1/tokens") == {
        "DELETE /v1/tokens/{token_id}": {"token_id": "$response.body#/token_id"}}
    assert targets_of("POST /v1/apps")["POST /v1/apps/{name}/keys"] == {
        "name": "$response.body#/name"}
    assert targets_of("PUT /v1/destinations/{code}")["GET /v1/subscriptions"] == {
        "destination": "$request.path.code"}


# Header values no generator sends: latin-1 bytes that are not ASCII, control characters, 64 KiB
ODD_HEADER_VALUES = [b"Bearer \xe9t\xe9", b"Bearer a\x01b", b"Bearer " + b"x" * 65_536,
                     b"\xff\xfe", b"Basic Zm9vOmJhcg=="]
AUTHENTICATED = {"receiver": ("POST", "/v1/destinations/fuzz-dest/messages"),
                 "admin": ("GET", "/v1/destinations"),
                 "dispatcher": ("POST", "/internal/v1/deliveries")}


def _raw_status(url: str, method: str, path: str, header: bytes) -> int:
    """The status of a request sent byte for byte (HTTP clients refuse to send such headers)."""
    address = urlsplit(url)
    request = (f"{method} {path} HTTP/1.1\r\nHost: {address.netloc}\r\n".encode()
               + b"Authorization: " + header + b"\r\nContent-Type: application/json\r\n"
               + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
    with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
        conn.sendall(request)
        status_line = conn.makefile("rb").readline()
    return int(status_line.split()[1])


@pytest.mark.parametrize("service", list(AUTHENTICATED))
@pytest.mark.parametrize("header", ODD_HEADER_VALUES, ids=lambda h: repr(h[:12]))
def test_odd_authorization_headers_get_a_4xx(targets: dict[str, Target], service: str,
                                             header: bytes) -> None:
    method, path = AUTHENTICATED[service]
    status = _raw_status(targets[service].url, method, path, header)
    assert 400 <= status < 500, status
