"""The receiver's OpenAPI document.

The ingest handlers read raw bodies (faster than pydantic models, see receiver/app.py), so
FastAPI cannot infer their request and response schemas: the two operations are written here
and replace what FastAPI generates for them. docs/protocol.md explains the same in prose.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from msgbus.apidoc import OWN_ERRORS, describe_errors
from msgbus.apidoc import error_response_doc as _error
from msgbus.models import CODE_PATTERN, MAX_DELIVERY_DELAY_S
from msgbus.settings import ReceiverSettings
from msgbus.tracecontext import MAX_TRACESTATE_CHARS, TRACEPARENT_PATTERN, TRACESTATE_PATTERN
from receiver.parsing import (
    BIZ_ID_HEADER,
    DELAY_HEADER,
    DELIVER_AT_HEADER,
    HEADER_NAME_PATTERN,
    ID_HEADER,
    MAX_BIZ_ID_CHARS,
    MAX_HEADERS,
    MEDIA_TYPE_PATTERN,
    TIME_HEADER,
    UUID7_PATTERN,
)

SINGLE_PATH = "/v1/destinations/{code}/messages"
BATCH_PATH = "/v1/messages"

_NO_CONTROL_CHARS = r"^[^\u0000-\u001f\u007f]*$"
TRACE_DEPENDENCY = {"tracestate": ["traceparent"]}
ONE_DELAY = {"required": ["deliver_at", "delay_s"]}  # one of them, or neither


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _message_properties(max_message_bytes: int) -> dict[str, Any]:
    return {
        "message_id": {"type": "string", "pattern": UUID7_PATTERN,
                       "description": "UUIDv7 made by the client, lower-case canonical form; "
                                      "re-sending the same id is answered 'duplicate'"},
        "biz_id": {"type": "string", "minLength": 1, "maxLength": MAX_BIZ_ID_CHARS,
                   "pattern": _NO_CONTROL_CHARS,
                   "description": "the business entity (e.g. an order id), for queries and "
                                  "consumer idempotency"},
        "created_at": {"type": "string", "format": "date-time",
                       "description": "RFC 3339 with a time zone; default: when received"},
        "headers": {"type": "object", "maxProperties": MAX_HEADERS,
                    "propertyNames": {"pattern": HEADER_NAME_PATTERN},
                    "additionalProperties": {"type": "string"},
                    "description": "pushed to subscribers as x-msgbus-<name> headers; values "
                                   "without control characters (tab allowed), names and values "
                                   "8192 characters at most in all"},
        "body": {"description": f"the message: any JSON value (at most {max_message_bytes} "
                                "bytes encoded, 254 levels deep, integers within 64 bits)"},
        "body_base64": {"type": "string", "contentEncoding": "base64",
                        "description": "the message as opaque bytes, instead of 'body'"},
        "content_type": {"type": "string", "maxLength": 255, "pattern": MEDIA_TYPE_PATTERN,
                         "description": "MIME type of body_base64 (default "
                                        "application/octet-stream); 'body' is always JSON"},
        "traceparent": {"type": "string", "pattern": TRACEPARENT_PATTERN,
                        "description": "W3C Trace Context of the producer's span; pushes carry "
                                       "it (default: the request's traceparent header)"},
        "tracestate": {"type": "string", "maxLength": MAX_TRACESTATE_CHARS,
                       "pattern": TRACESTATE_PATTERN,
                       "description": "W3C tracestate, with a traceparent"},
        "deliver_at": {"type": "string", "format": "date-time",
                       "description": "RFC 3339 with a time zone: pushed to no subscriber "
                                      "before this; at most 30 days ahead; a time passed "
                                      "means now. Not with delay_s"},
        "delay_s": {"type": "number", "minimum": 0, "maximum": MAX_DELIVERY_DELAY_S,
                    "description": "pushed to no subscriber sooner than this many seconds "
                                   "after it is received (at most 30 days). Not with "
                                   "deliver_at"},
    }


def _schemas(settings: ReceiverSettings) -> dict[str, Any]:
    properties = _message_properties(settings.max_message_bytes)
    one_body = [{"required": ["body"]}, {"required": ["body_base64"]}]
    return {
        "Message": {"type": "object", "required": ["message_id"], "oneOf": one_body,
                    "dependentRequired": TRACE_DEPENDENCY, "not": ONE_DELAY,
                    "properties": properties, "additionalProperties": False},
        "BatchMessage": {
            "type": "object", "required": ["destination", "message_id"], "oneOf": one_body,
            "dependentRequired": TRACE_DEPENDENCY, "not": ONE_DELAY,
            "properties": {"destination": {"type": "string", "pattern": CODE_PATTERN},
                           **properties},
            "additionalProperties": False},
        "Batch": {"type": "object", "required": ["messages"], "properties": {
            "messages": {"type": "array", "minItems": 1, "maxItems": settings.max_batch_count,
                         "items": _ref("schemas", "BatchMessage")}}},
        "Accepted": {"type": "object", "required": ["message_id", "status"],
                     "additionalProperties": False, "properties": {
                         "message_id": {"type": "string"},
                         "status": {"type": "string", "enum": ["accepted", "duplicate"],
                                    "description": "duplicate: this receiver had already "
                                                   "accepted the message_id; not sent again"}}},
        "BatchResult": {
            "type": "object", "required": ["message_id", "status", "error"],
            "additionalProperties": False, "properties": {
                "message_id": {"type": ["string", "null"],
                               "description": "null when the item had no usable message_id"},
                "status": {"type": "integer", "enum": [202, 400, 403, 404, 413, 422, 503],
                           "description": "202 accepted; otherwise what the single endpoint "
                                          "would have answered for this message"},
                "error": {"oneOf": [_ref("schemas", "Error"), {"type": "null"}]},
                "duplicate": {"type": "boolean", "description": "true: already accepted"}}},
        "BatchResults": {"type": "object", "required": ["results"],
                         "additionalProperties": False, "properties": {
                             "results": {"type": "array",
                                         "items": _ref("schemas", "BatchResult"),
                                         "description": "one per message, in request order"}}},
    }


_RESPONSES = {  # the receiver's own words for msgbus.http.STANDARD_ERRORS, and two more
    "BadRequest": _error("The body is not valid JSON, or not a batch object"),
    "Unauthorized": _error("Missing, unknown or revoked API key"),
    "Forbidden": _error("The producer app may not send to this destination"),
    "NotFound": _error("Unknown destination (or not a valid destination code)"),
    "TooLarge": _error("The body, message or batch is over the receiver's limits"),
    "UnsupportedMediaType": _error("A Content-Type other than application/json, without "
                                   f"the {ID_HEADER} header of a raw message"),
    "Invalid": _error("The message is malformed; `field` names what is wrong"),
    "TooManyAttempts": _error("Too many wrong API keys from this address; retry after "
                              "Retry-After seconds", retry_after=True),
    "Unavailable": _error("Busy or degraded: the receiver's buffer is full (error "
                          "'buffer_full'), or MongoDB is down and the API key or destination "
                          "is not cached. Retry after Retry-After seconds.", retry_after=True),
}


def _raw_header(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description,
            "schema": schema}


def _error_responses(*statuses: int) -> dict[str, Any]:
    names = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
             413: "TooLarge", 415: "UnsupportedMediaType", 422: "Invalid",
             429: "TooManyAttempts", 503: "Unavailable"}
    return {str(status): _ref("responses", names[status]) for status in statuses}


def _ingest_operation(summary: str, operation_id: str, description: str,
                      content: dict[str, Any], responses: dict[str, Any],
                      parameters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An ingest operation: authenticated, tagged "ingest", with its own error bodies."""
    operation = {"summary": summary, "operationId": operation_id, "description": description,
                 "requestBody": {"required": True, "content": content},
                 "responses": responses, "security": [{"bearerAuth": []}],
                 "tags": ["ingest"], OWN_ERRORS: True}
    if parameters is not None:
        operation["parameters"] = parameters
    return operation


def _single_operation() -> dict[str, Any]:
    return _ingest_operation(
        "Send one message", "send_message",
        "Either a JSON envelope (`Message`; Content-Type application/json, or none), or "
        "the message itself as the raw body: any other Content-Type (the message's own) "
        f"plus the `{ID_HEADER}` header, and optionally `{BIZ_ID_HEADER}`, `{TIME_HEADER}` "
        "and `x-msgbus-<name>` headers. The raw-form headers are refused with a JSON "
        "envelope. 202 means the message is durable on the receiver.",
        parameters=[
            {"name": "code", "in": "path", "required": True, "description": "destination code",
             "schema": {"type": "string", "pattern": CODE_PATTERN}},
            _raw_header(ID_HEADER, "raw form (required there): the message_id",
                        {"type": "string", "pattern": UUID7_PATTERN}),
            _raw_header(BIZ_ID_HEADER, "raw form: the biz_id (UTF-8)",
                        {"type": "string", "minLength": 1, "maxLength": MAX_BIZ_ID_CHARS}),
            _raw_header(TIME_HEADER, "raw form: created_at (RFC 3339)",
                        {"type": "string", "format": "date-time"}),
            _raw_header(DELIVER_AT_HEADER, "raw form: deliver_at (RFC 3339)",
                        {"type": "string", "format": "date-time"}),
            _raw_header(DELAY_HEADER, f"raw form: delay_s (seconds; not with {DELIVER_AT_HEADER})",
                        {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"}),
        ],
        content={
            "application/json": {"schema": _ref("schemas", "Message")},
            # the raw form, with the ce-id header: any Content-Type but application/json
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
        responses={
            "202": {"description": "Accepted and durable (or already accepted: 'duplicate')",
                    "content": {"application/json": {"schema": _ref("schemas", "Accepted")}}},
            **_error_responses(400, 401, 403, 404, 413, 415, 422, 429, 503),
        })


def _batch_operation() -> dict[str, Any]:
    return _ingest_operation(
        "Send a batch of messages", "send_batch",
        "Each message names its destination and gets its own result, in request order; "
        "the accepted ones are durable when the answer comes. A whole-request error "
        "(401, 413, 503, ...) means no message of the batch was accepted.",
        content={"application/json": {"schema": _ref("schemas", "Batch")}},
        responses={
            "200": {"description": "One result per message",
                    "content": {"application/json": {
                        "schema": _ref("schemas", "BatchResults")}}},
            **_error_responses(400, 401, 413, 415, 429, 503),
        })


def receiver_openapi(app: FastAPI, settings: ReceiverSettings) -> dict[str, Any]:
    document = get_openapi(
        title=app.title, version=app.version, routes=app.routes,
        description="The bus's front door: producer apps send messages here. /metrics "
                    "(Prometheus text) is not described; /health is for probes.")
    # The ingest endpoints are plain Starlette routes (receiver/app.py), which FastAPI does not
    # describe: their operations go in, in route order like the paths FastAPI generates.
    ingest = {SINGLE_PATH: {"post": _single_operation()},
              BATCH_PATH: {"post": _batch_operation()}}
    generated = document.get("paths", {})
    route_paths = [getattr(route, "path", None) for route in app.routes]
    paths = {path: ingest.get(path) or generated[path] for path in route_paths
             if isinstance(path, str) and (path in ingest or path in generated)}
    document["paths"] = {**paths, **generated, **ingest}
    components = describe_errors(document)["components"]
    components["schemas"].update(_schemas(settings))
    components["responses"].update(_RESPONSES)
    components["securitySchemes"] = {"bearerAuth": {
        "type": "http", "scheme": "bearer",
        "description": "the producer app's API key (mbk_...), from the admin API"}}
    return document
