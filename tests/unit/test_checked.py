"""Stored documents that do not validate: reported once per change, counted in one gauge that
several stores of a process share, and never written in the first place."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from msgbus.errors import InvalidConfig
from msgbus.models import Destination, Subscription
from msgbus.store import documents as docs
from msgbus.store.checked import InvalidDocumentLog, read_each, storable


def _gauge(collection: str) -> float:
    value = REGISTRY.get_sample_value("msgbus_config_invalid_documents",
                                      {"collection": collection})
    return value or 0.0


def test_a_store_that_sees_no_invalid_document_does_not_hide_another_ones() -> None:
    seeing, blind = InvalidDocumentLog(), InvalidDocumentLog()
    bad = {"_id": "unit-bad", "broker": "carrier-pigeon"}
    loaded = read_each([bad], "unit_destinations", docs.destination_from_doc, seeing)
    seeing.whole_collection("unit_destinations", loaded.invalid)
    blind.whole_collection("unit_destinations", [])
    assert loaded.invalid[0].field == "broker"
    assert _gauge("unit_destinations") == 1
    seeing.whole_collection("unit_destinations", [])  # fixed: gone from every reader
    assert _gauge("unit_destinations") == 0


def test_a_document_is_stored_only_in_a_form_its_readers_accept() -> None:
    storable(docs.destination_doc(Destination(code="ok")), docs.destination_from_doc)
    long_url = "https://" + "0" * 60 + ".com/" + "a" * 2007 + " x"
    sub = Subscription(destination="ok", name="s5", url=long_url)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig) as refused:
        storable(docs.subscription_doc(sub), docs.subscription_from_doc)
    assert refused.value.field == "url"
