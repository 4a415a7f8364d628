from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from msgbus.codec import decode, decode_batch, encode, encode_batch
from msgbus.errors import InvalidMessage
from msgbus.ids import is_message_id, uuid7, uuid7_time
from msgbus.models import Envelope


def test_uuid7_is_version_7_time_ordered_and_valid() -> None:
    ids = [uuid7() for _ in range(1000)]
    assert all(uuid.UUID(i).version == 7 and is_message_id(i) for i in ids)
    assert len(set(ids)) == 1000
    assert [i[:13] for i in ids] == sorted(i[:13] for i in ids)  # the millisecond prefix
    assert abs((uuid7_time(ids[0]) - datetime.now(UTC)).total_seconds()) < 5


@pytest.mark.parametrize("bad", ["", "42", "01A1FDB1-446B-7D93-B5CC-B0609E3A07BC", None, 7])
def test_is_message_id_rejects_non_canonical_values(bad: object) -> None:
    assert not is_message_id(bad)


def test_envelope_round_trips_with_opaque_body() -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    envelope = Envelope(message_id=uuid7(), destination="orders", body=b"\x00\xffbinary",
                        content_type="application/octet-stream", biz_id="o-1",
                        source_app="shop", created_at=created, received_at=created,
                        headers={"trace": "abc"})
    assert decode(encode(envelope)) == envelope


def test_batch_round_trips_and_truncation_is_an_error() -> None:
    envelopes = [Envelope(message_id=uuid7(), destination="d", body=b"{}") for _ in range(3)]
    data = encode_batch(envelopes)
    assert [e.message_id for e in decode_batch(data)] == [e.message_id for e in envelopes]
    with pytest.raises(InvalidMessage):
        decode_batch(data[:-1])
    with pytest.raises(InvalidMessage):
        decode(b"garbage")
