"""The web UI's page of a destination's payload schema: its versions, a diff between two of
them (a unified diff of the pretty-printed JSON, rendered here), the changes the compatibility
rules see, and "try a message" against a version (a form whose answer is the same page with
the verdict: read-only, so a plain form post)."""

from __future__ import annotations

import difflib
import json
from typing import Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from admin.deps import Store, UiUser, parts_of
from admin.schema_compat import schema_changes
from admin.ui import page
from msgbus.models import PayloadSchema
from msgbus.payload_schema import compile_schema, first_error
from msgbus.store.schemas import SchemaStore

router = APIRouter(include_in_schema=False)


def pretty(schema: Any) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False)


def unified_diff(old: PayloadSchema, new: PayloadSchema) -> list[str]:
    return list(difflib.unified_diff(
        pretty(old.schema_).splitlines(), pretty(new.schema_).splitlines(),
        f"version {old.version}", f"version {new.version}", lineterm=""))


def try_body(schema: PayloadSchema, text: str) -> dict[str, Any]:
    """The verdict on a body typed into the form."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        return {"valid": False, "message": f"not JSON: {exc}", "pointer": "", "keyword": ""}
    found = first_error(compile_schema(schema.schema_), body)
    if found is None:
        return {"valid": True}
    return {"valid": False, "message": found.message, "pointer": found.pointer or "/",
            "keyword": found.keyword}


def _pick(versions: list[PayloadSchema], wanted: int | None,
          default: PayloadSchema | None) -> PayloadSchema | None:
    return next((v for v in versions if v.version == wanted), default)


async def _render(request: Request, who: Any, store: Any, code: str, *, a: int | None = None,
                  b: int | None = None, tried: dict[str, Any] | None = None) -> Response:
    await store.config.get_destination(code)
    versions = await SchemaStore(parts_of(request).service.store).versions(code)
    new = _pick(versions, b, versions[-1] if versions else None)
    old = _pick(versions, a, versions[-2] if len(versions) > 1 else None)
    diff = unified_diff(old, new) if old is not None and new is not None else []
    changes = schema_changes(old.schema_, new.schema_) if old and new else []
    return page(request, "schemas.html", who, page="Destinations", code=code,
                versions=list(reversed(versions)), old=old, new=new, diff=diff,
                changes=[c.to_json() for c in changes], tried=tried or {},
                latest=pretty(versions[-1].schema_) if versions else "")


@router.get("/ui/destinations/{code}/schemas", response_model=None)
async def schemas_page(request: Request, code: str, who: UiUser, store: Store,
                       a: int | None = None, b: int | None = None) -> Response:
    return await _render(request, who, store, code, a=a, b=b)


@router.post("/ui/destinations/{code}/schemas/try", response_model=None)
async def try_message(request: Request, code: str, who: UiUser, store: Store,
                      version: int = Form(...), body: str = Form(...)) -> Response:
    schema = await SchemaStore(store).get(code, version)
    verdict = try_body(schema, body) | {"version": version, "body": body}
    return await _render(request, who, store, code, tried=verdict)
