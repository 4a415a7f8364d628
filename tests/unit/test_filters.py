"""Subscription filters decide which messages a subscriber gets."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from msgbus.delivery.filters import matches
from msgbus.models import Envelope, MessageFilter, Subscription


def _sub(*filters: tuple[str, list[str]]) -> Subscription:
    return Subscription(destination="orders", name="s", url="http://127.0.0.1/hook",  # type: ignore[arg-type]
                        filters=[MessageFilter(field=f, values=v) for f, v in filters])


def _message(body: Any = None, *, raw: bytes | None = None, content_type: str = "application/json",
             biz_id: str | None = None, **headers: str) -> Envelope:
    return Envelope(message_id="m", destination="orders",
                    body=raw if raw is not None else orjson.dumps(body),
                    content_type=content_type, biz_id=biz_id, headers=headers)


def test_no_filters_match_everything() -> None:
    assert matches(_sub(), _message(raw=b"\x00", content_type="application/octet-stream"))


def test_header_filter_is_case_insensitive_on_the_name() -> None:
    sub = _sub(("header:Tier", ["vip", "gold"]))
    assert matches(sub, _message({}, tier="gold"))
    assert not matches(sub, _message({}, tier="basic"))
    assert not matches(sub, _message({}))


def test_body_paths_reach_nested_fields_and_list_items() -> None:
    sub = _sub(("body:order.items.1.sku", ["B-2"]))
    assert matches(sub, _message({"order": {"items": [{"sku": "A-1"}, {"sku": "B-2"}]}}))
    assert not matches(sub, _message({"order": {"items": [{"sku": "B-2"}]}}))
    assert not matches(sub, _message({"order": "B-2"}))


@pytest.mark.parametrize(("value", "text"), [(True, "true"), (12, "12"), (1.5, "1.5"),
                                             ("x", "x")])
def test_json_scalars_compare_as_the_text_an_operator_types(value: Any, text: str) -> None:
    assert matches(_sub(("body:v", [text])), _message({"v": value}))


def test_objects_nulls_and_non_json_bodies_never_match_a_body_filter() -> None:
    sub = _sub(("body:v", ["None", "null", "{}"]))
    assert not matches(sub, _message({"v": None}))
    assert not matches(sub, _message({"v": {}}))
    assert not matches(sub, _message(raw=b"v=1", content_type="text/plain"))
    assert not matches(sub, _message(raw=b"{not json"))


def test_every_filter_must_match() -> None:
    sub = _sub(("biz_id", ["o-1"]), ("body:country", ["fr"]))
    assert matches(sub, _message({"country": "fr"}, biz_id="o-1"))
    assert not matches(sub, _message({"country": "fr"}, biz_id="o-2"))
    assert not matches(sub, _message({"country": "de"}, biz_id="o-1"))


@pytest.mark.parametrize("field", ["colour", "body:", "header:", "header:a b", "body:.x"])
def test_unknown_filter_fields_are_refused(field: str) -> None:
    with pytest.raises(ValidationError):
        MessageFilter(field=field, values=["x"])
