"""Stored configuration that does not validate, in the management API.

- `GET /v1/invalid-documents` (viewer): every document of the configuration collections that
  does not validate (an old version's, one edited by hand), with the field and the reason. The
  services skip them and serve the rest.
- `DELETE /v1/invalid-documents/{collection}/{id}` (admin): deletes one; a valid document is
  refused (it is changed through its own API). A PUT of the resource (destination,
  subscription, user), `POST /v1/apps` or `PATCH /v1/runtime` replaces one instead.
- Lists of the API answer the valid items and say in `X-Msgbus-Left-Out` how many they left
  out.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Response

from admin.access import AdministersBus
from admin.deps import Store, Users
from admin.params import ConfigCollection, StoredId
from msgbus.store.checked import Loaded

T = TypeVar("T")
LEFT_OUT_HEADER = "X-Msgbus-Left-Out"
# the OpenAPI description of a list's answer
LIST_RESPONSES: dict[int | str, dict[str, Any]] = {200: {"headers": {LEFT_OUT_HEADER: {
    "description": "how many stored items did not validate and were left out of this list "
                   "(see GET /v1/invalid-documents); absent when none",
    "schema": {"type": "integer", "minimum": 1}}}}}


def valid_items(response: Response, loaded: Loaded[T]) -> list[T]:
    """The items of a list answer; says how many were left out."""
    if loaded.invalid:
        response.headers[LEFT_OUT_HEADER] = str(len(loaded.invalid))
    return loaded.items


router = APIRouter()


@router.get("/v1/invalid-documents")
async def list_invalid_documents(_: AdministersBus, store: Store) -> dict[str, Any]:
    """Stored configuration that does not validate and that every service skips."""
    found = [d.to_json() for d in await store.invalid.in_every_collection()]
    return {"count": len(found), "documents": found}


@router.delete("/v1/invalid-documents/{collection}/{doc_id:path}", status_code=204)
async def delete_invalid_document(collection: ConfigCollection, doc_id: StoredId,
                                  who: AdministersBus, store: Store, users: Users) -> None:
    await store.invalid.delete(collection, doc_id)
    await users.audit(who, "invalid_document.delete", f"{collection}/{doc_id}")
