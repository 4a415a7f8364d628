from __future__ import annotations

import base64
import hashlib
import hmac
import random
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote

from msgbus.codec import decode, encode
from msgbus.delivery.headers import push_headers
from msgbus.delivery.retry import decide_retry
from msgbus.delivery.signing import secret_key, sign
from msgbus.models import AttemptResult, Envelope, RetryPolicy, Subscription, new_signing_secret

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def _failure(status: int | None = 500, retry_after: float | None = None) -> AttemptResult:
    return AttemptResult(message_id="m", subscription="d/s", attempt=1, started_at=NOW,
                         latency_ms=1.0, status_code=status, error="boom",
                         retry_after_s=retry_after)


def test_signature_follows_standard_webhooks() -> None:
    secret = new_signing_secret()
    header = sign([secret], "msg_1", 1700000000, b'{"a":1}')
    expected = base64.b64encode(hmac.new(secret_key(secret), b'msg_1.1700000000.{"a":1}',
                                         hashlib.sha256).digest()).decode()
    assert header == f"v1,{expected}"
    two = sign([secret, new_signing_secret()], "msg_1", 1700000000, b"x").split(" ")
    assert len(two) == 2 and all(s.startswith("v1,") for s in two)


def test_push_headers_carry_cloudevents_and_signature() -> None:
    sub = Subscription(destination="orders", name="billing", url="http://x/hook")  # type: ignore[arg-type]
    env = Envelope(message_id="0190-id", destination="orders", body=b"{}", biz_id="o-9",
                   source_app="shop", created_at=NOW, headers={"Trace": "t1"})
    headers = push_headers(env, sub, attempt=3)
    assert headers["ce-id"] == headers["webhook-id"] == "0190-id"
    assert headers["ce-type"] == "orders" and headers["ce-bizid"] == "o-9"
    assert headers["ce-attempt"] == "3" and headers["ce-specversion"] == "1.0"
    assert headers["ce-time"] == "2026-11-21T12:00:00Z"
    assert headers["x-msgbus-trace"] == "t1"
    assert headers["webhook-signature"].startswith("v1,")


def test_retry_follows_the_delay_schedule_with_jitter() -> None:
    policy = RetryPolicy()
    rng = random.Random(1)
    delays = []
    for attempts in (1, 2, 3, 30):
        decision = decide_retry(policy, _failure(), attempts_so_far=attempts,
                                first_created_at=NOW, now=NOW, rng=rng)
        assert not decision.park and decision.next_attempt_at is not None
        delays.append((decision.next_attempt_at - NOW).total_seconds())
    for got, want in zip(delays, (10, 30, 60, 7200), strict=True):
        assert want * 0.9 <= got <= want * 1.1


def test_retry_after_permanent_codes_and_limits() -> None:
    policy = RetryPolicy(permanent_status_codes=[410], max_attempts=5, max_age_s=3600)
    later = decide_retry(policy, _failure(503, retry_after=120), attempts_so_far=1,
                         first_created_at=NOW, now=NOW)
    assert later.next_attempt_at is not None and later.next_attempt_at >= NOW + timedelta(
        seconds=120)
    assert decide_retry(policy, _failure(410), attempts_so_far=1, first_created_at=NOW,
                        now=NOW).park
    assert decide_retry(policy, _failure(), attempts_so_far=5, first_created_at=NOW,
                        now=NOW).park
    assert decide_retry(policy, _failure(), attempts_so_far=1,
                        first_created_at=NOW - timedelta(hours=2), now=NOW).park


def test_a_push_carries_the_trace_context_and_a_percent_encoded_biz_id() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    env = Envelope(message_id="m1", destination="orders", body=b"{}", biz_id='订单 "42" 100%',
                   traceparent=parent, tracestate="v=1")
    sub = Subscription(destination="orders", name="s", url="http://x/")  # type: ignore[arg-type]
    headers = push_headers(env, sub, attempt=1)
    assert headers["ce-bizid"] == "%E8%AE%A2%E5%8D%95%20%2242%22%20100%25"
    assert unquote(headers["ce-bizid"]) == env.biz_id
    assert headers["traceparent"] == headers["ce-traceparent"] == parent
    assert headers["tracestate"] == headers["ce-tracestate"] == "v=1"
    hop = "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
    headers = push_headers(env, sub, attempt=2, hop_traceparent=hop)
    assert (headers["traceparent"], headers["ce-traceparent"]) == (hop, parent)
    untraced = push_headers(Envelope(message_id="m2", destination="orders", body=b""), sub, 1)
    assert not {"traceparent", "tracestate", "ce-traceparent"} & set(untraced)


def test_the_codec_keeps_the_trace_context() -> None:
    env = Envelope(message_id="m1", destination="orders", body=b"x",
                   traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                   tracestate="v=1")
    decoded = decode(encode(env))
    assert (decoded.traceparent, decoded.tracestate) == (env.traceparent, env.tracestate)
