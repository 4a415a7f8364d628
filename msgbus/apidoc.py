"""What every service's OpenAPI document says beyond what FastAPI infers: the JSON errors each
operation can answer (`describe_errors`) and the links between operations (`describe_links`),
so that clients, and the schemathesis runs of the suite, know every answer to expect."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error", "message"], "properties": {
        "error": {"type": "string", "description": "machine-readable code, e.g. "
                                                   "invalid_input, not_found, buffer_full"},
        "message": {"type": "string", "description": "what is wrong, for a human"},
        "field": {"type": ["string", "null"],
                  "description": "the field, parameter or header at fault, when there is one"},
        "errors": {"type": "array", "description": "invalid_input: every field at fault "
                                                   "(the first is `field` and `message`)",
                   "items": {"type": "object", "properties": {
                       "field": {"type": ["string", "null"]}, "message": {"type": "string"}}}},
        "pointer": {"type": "string", "description": "schema_violation: the JSON pointer "
                                                     "(RFC 6901) of the value at fault in the "
                                                     "body"},
        "keyword": {"type": "string", "description": "schema_violation: the JSON Schema "
                                                     "keyword of the rule broken"},
        "schema_version": {"type": ["integer", "null"],
                           "description": "schema_violation: the schema version checked"},
        "incompatibilities": {
            "type": "array", "description": "incompatible_schema: each change that breaks the "
                                            "destination's compatibility mode",
            "items": {"type": "object", "properties": {
                "path": {"type": "string"}, "message": {"type": "string"},
                "breaks": {"type": "array", "items": {"type": "string"}}}}}}}
RETRY_AFTER_HEADER: dict[str, Any] = {
    "description": "seconds to wait before retrying", "required": True,
    "schema": {"type": "integer", "minimum": 0}}


def error_response_doc(description: str, *, retry_after: bool = False) -> dict[str, Any]:
    """An OpenAPI response answering the JSON error body (components: Error, RetryAfter)."""
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    if retry_after:
        response["headers"] = {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}}
    return response


# status -> (name in components/responses, the response)
STANDARD_ERRORS: dict[str, tuple[str, dict[str, Any]]] = {
    "400": ("BadRequest", error_response_doc(
        "The request cannot be read (a body that is not JSON) or breaks a rule of the "
        "operation; `field` names what is wrong")),
    "401": ("Unauthorized", error_response_doc("Missing, wrong, expired or revoked credentials")),
    "403": ("Forbidden", error_response_doc("The credentials do not allow this")),
    "404": ("NotFound", error_response_doc("Something the request names does not exist")),
    "409": ("Conflict", error_response_doc(
        "The current state does not allow it: it exists already, it is in another state, or "
        "what is stored under that name no longer validates (fix or delete it first)")),
    "422": ("Invalid", error_response_doc(
        "A parameter, header or body field is not valid; `field` names it")),
    "429": ("TooManyAttempts", error_response_doc(
        "Too many failed sign-ins or wrong credentials from here (msgbus/throttle.py); retry "
        "after Retry-After seconds", retry_after=True)),
    "503": ("Unavailable", error_response_doc(
        "A dependency (MongoDB, a broker) is down or a buffer is full; retry after Retry-After "
        "seconds", retry_after=True)),
}
# An operation with this extension set lists exactly the errors it answers itself (the
# receiver's ingest, the dispatcher's internal endpoint): `describe_errors` leaves it alone.
OWN_ERRORS = "x-msgbus-own-errors"
_HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"


def error_statuses(operation: dict[str, Any]) -> list[str]:
    """What an operation can answer besides success, from what it takes: input (parameters,
    body) can be invalid (400, 422); input or credentials can be refused (401, 403; 429 after
    too many wrong ones) and need MongoDB (503); a name in the path or the body can be unknown
    (404) or in a conflicting state (409)."""
    parameters = operation.get("parameters", [])
    names_something = "requestBody" in operation or any(
        p.get("in") == "path" for p in parameters)
    takes_input = names_something or bool(parameters)
    statuses = []
    if takes_input:
        statuses += ["400", "422"]
    if takes_input or operation.get("security"):
        statuses += ["401", "403", "429", "503"]
    if names_something:
        statuses += ["404", "409"]
    return sorted(statuses)


def _is_fastapi_422(response: dict[str, Any]) -> bool:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return bool(schema.get("$ref") == _FASTAPI_422)


def describe_errors(document: dict[str, Any]) -> dict[str, Any]:
    """Adds to each operation of an OpenAPI document (but those marked OWN_ERRORS) the error
    responses it can answer (`error_statuses`), and their components. FastAPI's own 422 goes:
    it describes a body that the error handlers never send. Idempotent."""
    for item in document.get("paths", {}).values():
        for method, operation in item.items():
            if method not in _HTTP_METHODS or operation.get(OWN_ERRORS):
                continue
            responses = operation.setdefault("responses", {})
            for status in error_statuses(operation):
                if status not in responses or _is_fastapi_422(responses[status]):
                    name = STANDARD_ERRORS[status][0]
                    responses[status] = {"$ref": f"#/components/responses/{name}"}
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Error"] = ERROR_SCHEMA
    if _FASTAPI_422 not in str(document.get("paths")):
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
    components.setdefault("responses", {}).update(dict(STANDARD_ERRORS.values()))
    components.setdefault("headers", {})["RetryAfter"] = RETRY_AFTER_HEADER
    return document


def _path_parameters(path: str) -> list[str]:
    return re.findall(r"{(\w+)}", path)


def link_parameters(source_path: str, method: str, target_path: str) -> dict[str, str]:
    """The parameters of the link from a write (PUT or POST) on `source_path` to an
    operation on `target_path`, if the paths imply one: the same resource or one below it
    takes the same path parameters; the items of a collection that was POSTed to take their
    id from the answer's field named as the path parameter."""
    own = _path_parameters(source_path)
    if own and (target_path == source_path or target_path.startswith(source_path + "/")):
        return {name: f"$request.path.{name}" for name in own}
    if method == "post" and target_path.startswith(source_path + "/{"):
        item = _path_parameters(target_path[len(source_path):])[0]
        return {item: f"$response.body#/{item}"}
    return {}


def describe_links(document: dict[str, Any]) -> dict[str, Any]:
    """Adds to the success response of each write (PUT, POST) of an OpenAPI document the
    links its paths imply (`link_parameters`): where a client, or a stateful fuzzer, goes on
    with the resource it wrote. Idempotent."""
    operations = [(path, method, operation) for path, item in document.get("paths", {}).items()
                  for method, operation in item.items() if method in _HTTP_METHODS]
    for path, method, operation in operations:
        success = next((status for status in operation.get("responses", {})
                        if status.startswith("2")), None)
        if method not in ("put", "post") or success is None:
            continue
        links = {}
        for target_path, _, target in operations:
            parameters = link_parameters(path, method, target_path)
            if target is not operation and parameters and "operationId" in target:
                links[target["operationId"]] = {"operationId": target["operationId"],
                                                "parameters": parameters}
        if links:
            operation["responses"][success].setdefault("links", {}).update(links)
    return document


def describe_in_openapi(app: FastAPI) -> None:
    """The app's OpenAPI document describes its errors and links its operations."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = describe_links(describe_errors(generate()))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
