"""The core's error hierarchy.

    MsgbusError
    ├── InvalidInput            bad data from a caller; maps to a 4xx
    │   ├── InvalidMessage        envelope or body is malformed (400/422)
    │   │   └── SchemaViolation     the body breaks its destination's schema (422;
    │   │                           msgbus/payload_schema.py)
    │   ├── MessageTooLarge       body over the configured limit (413)
    │   ├── UnsupportedMediaType  a Content-Type the endpoint does not take (415)
    │   └── InvalidConfig         destination/subscription definition is invalid (422)
    ├── NotFound                unknown destination, subscription, message (404)
    ├── Conflict                already exists (409)
    │   ├── IncompatibleSchema    a schema version its compatibility mode refuses
    │   │                         (admin/schema_routes.py)
    │   └── InvalidStoredDocument a stored document no longer validates; fix or delete it
    ├── Unauthorized            missing or wrong credentials (401)
    ├── Forbidden               authenticated but not allowed (403)
    ├── Unavailable             a dependency is down or a local buffer is full (503)
    │   ├── BufferFull
    │   └── MongoUnavailable      this process's MongoDB gate is closed, or a call timed out
    │                             (msgbus/store/gate.py): callers take their outage path
    └── BrokerError             a broker refused or failed an operation (503)

A 503 tells the caller when to retry: `retry_after_s` becomes the HTTP Retry-After header.
"""

from typing import Any


class MsgbusError(Exception):
    """Base of every error the core raises on purpose."""

    status_code = 500
    code = "internal_error"
    retry_after_s: int | None = None

    def __init__(self, message: str, *, field: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s

    def to_json(self) -> dict[str, Any]:
        body = {"error": self.code, "message": self.message}
        if self.field:
            body["field"] = self.field
        return body


class InvalidInput(MsgbusError):
    status_code = 400
    code = "invalid_input"


class InvalidMessage(InvalidInput):
    status_code = 422
    code = "invalid_message"


class MessageTooLarge(InvalidInput):
    status_code = 413
    code = "message_too_large"


class UnsupportedMediaType(InvalidInput):
    status_code = 415
    code = "unsupported_media_type"


class InvalidConfig(InvalidInput):
    status_code = 422
    code = "invalid_config"


class NotFound(MsgbusError):
    status_code = 404
    code = "not_found"


class Conflict(MsgbusError):
    status_code = 409
    code = "conflict"


class InvalidStoredDocument(Conflict):
    """What is stored under this id does not validate (an old version's, edited by hand):
    the request cannot use it until an operator replaces or deletes it."""

    code = "invalid_stored_document"


class Unauthorized(MsgbusError):
    status_code = 401
    code = "unauthorized"


class Forbidden(MsgbusError):
    status_code = 403
    code = "forbidden"


class Unavailable(MsgbusError):
    status_code = 503
    code = "unavailable"
    retry_after_s = 1


class BufferFull(Unavailable):
    code = "buffer_full"
    retry_after_s = 5  # the buffer is flushed at MongoDB's pace: give it a few seconds


class MongoUnavailable(Unavailable):
    code = "mongo_unavailable"
    retry_after_s = 2  # the gate's probes look for MongoDB's return every few seconds at most


class BrokerError(MsgbusError):
    status_code = 503
    code = "broker_error"
    retry_after_s = 1
