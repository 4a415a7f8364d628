"""Pure parts: ids, request building, answer interpretation, backoff, Retry-After."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from msgbus_client.ids import rfc3339_ms, uuid7, uuid7_unix_ms
from msgbus_client.message import build_entry
from msgbus_client.protocol import (
    PostResult,
    batch_request,
    chunks,
    interpret_batch,
    interpret_single,
    single_request,
)
from msgbus_client.retry import ReceiverHealth, compute_backoff_s, retry_delay_s
from msgbus_client.transport import parse_retry_after


def test_uuid7_is_monotonic_with_version_and_variant() -> None:
    ids = [uuid7(1_700_000_000_000) for _ in range(1000)]  # same millisecond every time
    assert ids == sorted(ids) and len(set(ids)) == 1000
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert uuid7_unix_ms(ids[0]) >= 1_700_000_000_000
    assert uuid7(1) > ids[-1]  # a clock stepping back does not break the order


def test_rfc3339_ms() -> None:
    assert rfc3339_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert rfc3339_ms(1_700_000_000_005) == "2023-11-14T22:13:20.005Z"


def test_requests_for_one_and_for_several() -> None:
    a = build_entry("or ders".replace(" ", ""), {"x": 1}, biz_id="b")
    b = build_entry("pay.ments", b"\x01", content_type="image/png")
    single = single_request(a)
    assert single.path == "/v1/destinations/orders/messages"
    assert json.loads(single.body)["body"] == {"x": 1}
    batch = json.loads(batch_request([a, b]).body)
    assert [m["destination"] for m in batch["messages"]] == ["orders", "pay.ments"]
    assert batch["messages"][0]["message_id"] == a.message_id
    assert batch["messages"][1]["body_base64"] == "AQ=="


def test_interpretation_of_answers() -> None:
    a, b, c = (build_entry("d", n) for n in range(3))
    assert interpret_single(a, PostResult(202)).acked == [a]
    assert interpret_single(a, PostResult(None, error="refused")).retry == [a]
    assert interpret_single(a, PostResult(503, retry_after_s=2.0)).retry_after_s == 2.0
    assert interpret_single(a, PostResult(408)).retry == [a]
    assert interpret_single(a, PostResult(403)).retry == [a]
    rejected = interpret_single(a, PostResult(422, body=b'{"error": "x"}')).rejected
    assert rejected == [(a, 422, {"error": "x"})]

    results = {
        "results": [
            {"message_id": a.message_id, "status": 202, "error": None},
            {"message_id": b.message_id, "status": 404, "error": {"error": "unknown"}},
            {"message_id": c.message_id, "status": 503, "error": None},
        ]
    }
    outcome = interpret_batch([a, b, c], PostResult(200, body=json.dumps(results).encode()))
    assert outcome.acked == [a]
    assert outcome.rejected == [(b, 404, {"error": "unknown"})]
    assert outcome.retry == [c]
    assert interpret_batch([a, b], PostResult(413)).fallback_single
    assert interpret_batch([a, b], PostResult(503)).retry == [a, b]
    assert interpret_batch([a, b], PostResult(200, body=b"{}")).retry == [a, b]


def test_chunks_respect_count_and_size() -> None:
    entries = [build_entry("d", "x" * 100) for _ in range(10)]
    assert [len(c) for c in chunks(entries, 4, 10_000)] == [4, 4, 2]
    size = len(entries[0].payload)
    assert [len(c) for c in chunks(entries, 100, size * 3)] == [3, 3, 3, 1]
    assert [len(c) for c in chunks(entries[:2], 100, 1)] == [1, 1]


def test_backoff_grows_with_jitter_and_retry_after_wins() -> None:
    assert compute_backoff_s(1, 0.5, 60, rand=lambda: 0.0) == 0.25
    assert compute_backoff_s(3, 0.5, 60, rand=lambda: 0.999) < 2.0
    assert compute_backoff_s(50, 0.5, 60, rand=lambda: 0.0) == 30.0
    delay = retry_delay_s(9, 2.0, base_s=0.5, max_s=60, max_retry_after_s=600, rand=lambda: 0.5)
    assert delay == 2.1
    capped = retry_delay_s(1, 9999, base_s=0.5, max_s=60, max_retry_after_s=600, rand=lambda: 0)
    assert capped == 600


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    value = parse_retry_after(later)
    assert value is not None and 25 < value <= 30


def test_a_burst_of_concurrent_failures_counts_as_one() -> None:
    health = ReceiverHealth(base_s=10, max_s=60, max_retry_after_s=600)
    first = health.record_failure()
    for _ in range(20):  # other requests of the same burst fail while we already back off
        assert health.record_failure() <= first
    assert health.failures == 1
    assert health.backing_off()
    assert health.record_success()
    assert not health.backing_off() and health.failures == 0
    assert 3 <= health.record_failure(retry_after_s=3) <= 3.3  # Retry-After wins
