"""The receiver's OpenAPI document is valid and complete, and the running receiver keeps to it:
schemathesis sends schema-conforming and schema-violating requests to both ingest endpoints (to
a real destination and to random ones) and checks that none gets a 5xx, none goes unanswered,
and every answer conforms to the document."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.bus import RunningBus

SINGLE = "/v1/destinations/{code}/messages"
BATCH = "/v1/messages"
REQUEST_TIMEOUT_S = 10  # a request still unanswered by then fails the test: no hangs
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]
FUZZ_SETTINGS = settings(
    max_examples=75, deadline=None, database=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def schema(bus: RunningBus) -> Any:
    return schemathesis.openapi.from_url(f"{bus.receiver_url}/openapi.json")


@pytest.fixture(scope="module")
def destination(bus: RunningBus) -> str:
    code = "schema-fuzz"
    bus.create_destination(code, "direct")
    return code


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


def test_the_openapi_document_is_valid_and_describes_the_ingest_api(schema: Any) -> None:
    schema.validate()  # against the OpenAPI 3.1 meta-schema
    raw = schema.raw_schema
    assert raw["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    for path, statuses in {SINGLE: {"202", "400", "401", "403", "404", "413", "415", "422",
                                    "503"},
                           BATCH: {"200", "400", "401", "413", "415", "503"}}.items():
        operation = raw["paths"][path]["post"]
        assert set(operation["responses"]) == statuses
        assert operation["security"] == [{"bearerAuth": []}]
    unavailable = raw["components"]["responses"]["Unavailable"]
    assert "Retry-After" in unavailable["headers"]
    assert "/metrics" not in raw["paths"]


def _strategy(schema: Any, path: str, mode: GenerationMode, api_key: str,
              destination: str) -> st.SearchStrategy[Any]:
    operation = schema[path]["POST"]
    auth = {"Authorization": f"Bearer {api_key}"}
    generated = operation.as_strategy(generation_mode=mode, headers=auth)
    if path != SINGLE:
        return generated
    # random codes are all unknown (404): half the cases go to a real destination instead
    real = operation.as_strategy(generation_mode=mode, headers=auth,
                                 path_parameters={"code": destination})
    return st.one_of(real, generated)


def _aim_batch_at(body: Any, destination: str) -> None:
    """Random destination codes are all unknown: send every other message to a real one."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for item in messages[::2] if isinstance(messages, list) else ():
        if isinstance(item, dict):
            item["destination"] = destination


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", [SINGLE, BATCH])
def test_the_receiver_keeps_to_its_schema_under_fuzzing(
        bus: RunningBus, schema: Any, api_key: str, destination: str,
        session: requests.Session, path: str, mode: GenerationMode) -> None:
    checks = list(CHECKS)
    if mode is GenerationMode.NEGATIVE and path == SINGLE:
        # Not for the batch: it answers 200 with a verdict per message (an invalid item is
        # refused in its result, while the request as a whole is fine).
        checks.append(negative_data_rejection)

    @FUZZ_SETTINGS
    @given(case=_strategy(schema, path, mode, api_key, destination))
    def fuzz(case: Any) -> None:
        if path == BATCH and mode is GenerationMode.POSITIVE:
            _aim_batch_at(case.body, destination)
        response = case.call(base_url=bus.receiver_url, session=session,
                             timeout=REQUEST_TIMEOUT_S)
        event(f"HTTP {response.status_code}")  # see --hypothesis-show-statistics
        case.validate_response(response, checks=checks)

    fuzz()
