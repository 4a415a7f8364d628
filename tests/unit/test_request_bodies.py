"""Every number and boolean a client sends in a management API body is taken only in the JSON
type the OpenAPI document gives it: pydantic's lax mode would take `true` for 1 and "5" for 5,
and a client that relies on that breaks against any other implementation of the document."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from admin import schemas
from msgbus import models

BODIES = [model for module in (schemas, models)
          for _, model in inspect.getmembers(module, inspect.isclass)
          if issubclass(model, BaseModel) and model.__module__ == module.__name__
          and (module is schemas or issubclass(model, models.ConfigModel))]
WRONG_TYPES: dict[str, list[Any]] = {"integer": [True, "5"], "number": [True, "5"],
                                     "boolean": [1, "true"]}


def scalar_fields() -> list[tuple[str, str, TypeAdapter[Any], str]]:
    found = []
    for model in BODIES:
        for name, field in model.model_fields.items():
            annotation = (Annotated[field.annotation, *field.metadata] if field.metadata
                          else field.annotation)
            adapter: TypeAdapter[Any] = TypeAdapter(annotation)
            schema = adapter.json_schema()
            kinds = {option.get("type") for option in schema.get("anyOf", [schema])}
            found += [(model.__name__, name, adapter, kind) for kind in kinds & set(WRONG_TYPES)
                      if len(kinds & set(WRONG_TYPES)) == 1]  # int | bool takes both
    return found


FIELDS = scalar_fields()


def test_the_bodies_have_numbers_and_booleans_to_check() -> None:
    assert len(FIELDS) >= 5, [f"{model}.{name}" for model, name, _, _ in FIELDS]


@pytest.mark.parametrize(("model", "name", "adapter", "kind"), FIELDS,
                         ids=[f"{model}.{name}" for model, name, _, _ in FIELDS])
def test_a_value_of_the_wrong_json_type_is_refused(model: str, name: str,
                                                   adapter: TypeAdapter[Any], kind: str) -> None:
    for value in WRONG_TYPES[kind]:
        with pytest.raises(ValidationError):
            adapter.validate_python(value)
