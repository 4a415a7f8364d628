"""Stored configuration that may not validate: read it without stopping, write only what reads
back.

A document written by an older version, edited by hand or by a bug must never stop a service:
readers skip it (`read_each`), or refuse just that one (`read_one` raises
`InvalidStoredDocument`); either way it is reported once per change (logged with its id and the
reason, and counted in `msgbus_config_invalid_documents`), and the admin lists it to be fixed
or deleted. Writers store nothing that would not read back: `storable` encodes the document to
BSON, decodes it and parses it exactly as a reader will.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import bson
from bson.codec_options import CodecOptions
from bson.errors import BSONError
from pydantic import ValidationError

from msgbus.errors import InvalidConfig, InvalidStoredDocument, NotFound

log = logging.getLogger(__name__)

T = TypeVar("T")
Parse = Callable[[dict[str, Any]], T]

# what a parser may raise on a document of the wrong shape, besides pydantic's error
_SHAPE_ERRORS = (ValidationError, KeyError, TypeError, ValueError)
_READ_BACK: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True)
MAX_REASON_CHARS = 300
# every service reads all of the configuration every few seconds: it must stay small
MAX_CONFIG_DOCUMENT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class InvalidDocument:
    """A stored document that does not validate: where it is and why."""

    collection: str
    doc_id: str
    field: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"collection": self.collection, "id": self.doc_id, "field": self.field,
                "reason": self.reason}


@dataclass(slots=True)
class Loaded(Generic[T]):
    """The documents of a read that validate, and those left out."""

    items: list[T] = field(default_factory=list)
    invalid: list[InvalidDocument] = field(default_factory=list)


def explain(exc: Exception) -> tuple[str | None, str]:
    """(the field, a one-line reason) of a parse failure."""
    if isinstance(exc, ValidationError) and exc.errors():
        errors = exc.errors()
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        reason = f"{where or 'document'}: {first['msg']}"
        if len(errors) > 1:
            reason += f" (and {len(errors) - 1} more)"
        return where, reason[:MAX_REASON_CHARS]
    if isinstance(exc, KeyError):
        return str(exc.args[0]), f"{exc.args[0]}: missing"
    return None, f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]


class InvalidDocumentLog:
    """Says once per change which stored documents do not validate: a warning when one turns
    up or its reason changes, an info line when it is gone. A service's registry reads its
    configuration every few seconds; logging each read would bury everything else."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], str] = {}  # (collection, id) -> reason
        _LOGS.add(self)

    def seen(self, found: InvalidDocument) -> None:
        key = (found.collection, found.doc_id)
        if self._known.get(key) != found.reason:
            self._known[key] = found.reason
            log.warning("stored %s document %r does not validate and is skipped: %s "
                        "(fix or delete it in the admin: GET /v1/invalid-documents)",
                        found.collection, found.doc_id, found.reason)
            self._count(found.collection)

    def whole_collection(self, collection: str, invalid: Iterable[InvalidDocument]) -> None:
        """A read of every document of `collection` found exactly `invalid` there."""
        now = {found.doc_id for found in invalid}
        for key in [k for k in self._known if k[0] == collection and k[1] not in now]:
            del self._known[key]
            log.info("stored %s document %r is valid again or gone", collection, key[1])
        self._count(collection)

    def _count(self, collection: str) -> None:
        # imported here: the store is imported by `msgbus receiver` before it sets up
        # prometheus_client's multiprocess mode, which must come before its first import
        from msgbus import metrics

        # several stores in one process (`msgbus up`, or buses of tests) share the gauge: it
        # shows the most any of them sees, so one that sees none does not hide another's
        most = max((log.count(collection) for log in _LOGS), default=0)
        metrics.CONFIG_INVALID_DOCUMENTS.labels(collection).set(most)

    def count(self, collection: str) -> int:
        return sum(1 for c, _ in self._known if c == collection)


_LOGS: weakref.WeakSet[InvalidDocumentLog] = weakref.WeakSet()


def parse_or_report(doc: dict[str, Any], collection: str, parse: Parse[T],
                    reported: InvalidDocumentLog) -> T | InvalidDocument:
    try:
        return parse(doc)
    except _SHAPE_ERRORS as exc:
        where, reason = explain(exc)
        found = InvalidDocument(collection, str(doc.get("_id")), where, reason)
        reported.seen(found)
        return found


def read_valid(doc: dict[str, Any], collection: str, parse: Parse[T],
               reported: InvalidDocumentLog) -> T | None:
    """The parsed document, or None when it does not validate (reported)."""
    parsed = parse_or_report(doc, collection, parse, reported)
    return None if isinstance(parsed, InvalidDocument) else parsed


def read_each(docs: Iterable[dict[str, Any]], collection: str, parse: Parse[T],
              reported: InvalidDocumentLog) -> Loaded[T]:
    loaded: Loaded[T] = Loaded()
    for doc in docs:
        parsed = parse_or_report(doc, collection, parse, reported)
        if isinstance(parsed, InvalidDocument):
            loaded.invalid.append(parsed)
        else:
            loaded.items.append(parsed)
    return loaded


def read_one(doc: dict[str, Any], collection: str, parse: Parse[T],
             reported: InvalidDocumentLog) -> T:
    parsed = parse_or_report(doc, collection, parse, reported)
    if isinstance(parsed, InvalidDocument):
        raise InvalidStoredDocument(
            f"the stored {collection} document {parsed.doc_id!r} does not validate "
            f"({parsed.reason}); replace it with a valid one (PUT) or delete it "
            "(DELETE /v1/invalid-documents/...)", field=parsed.field)
    return parsed


async def find_valid(collection: Any, doc_id: str, what: str, field: str, parse: Parse[T],
                     reported: InvalidDocumentLog) -> dict[str, Any]:
    """The document `doc_id` of `collection`, checked with `parse`: a `NotFound` naming
    `field` when there is none, an `InvalidStoredDocument` when it does not validate."""
    doc: dict[str, Any] | None = await collection.find_one({"_id": doc_id})
    if doc is None:
        raise NotFound(f"unknown {what} {doc_id!r}", field=field)
    read_one(doc, collection.name, parse, reported)
    return doc


def storable(doc: dict[str, Any], parse: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    """`doc` as MongoDB will hand it back, checked with the parser its readers use; an
    `InvalidConfig` (422) naming the field when it would not read back (e.g. a URL that
    validated as given, but not in the longer form it is normalised to)."""
    try:
        encoded = bson.encode(doc)
        read_back = bson.decode(encoded, codec_options=_READ_BACK)
    except (BSONError, OverflowError, ValueError) as exc:
        raise InvalidConfig(f"cannot be stored in MongoDB: {exc}") from exc
    if len(encoded) > MAX_CONFIG_DOCUMENT_BYTES:
        raise InvalidConfig(f"{len(encoded)} bytes stored: over the {MAX_CONFIG_DOCUMENT_BYTES} "
                            "a configuration document may have")
    try:
        parse(read_back)
    except _SHAPE_ERRORS as exc:
        where, reason = explain(exc)
        raise InvalidConfig(f"would be stored in a form that does not validate: {reason}",
                            field=where) from exc
    return doc
