"""The compensator on real services: retries until success on a fast schedule, parking and
re-drive, sweeps of deliveries left pending, leases shared by several compensators, and
operator replays — through the admin API and the `msgbus` CLI.

This module runs a bus of its own (its own database), with a compensator that scans often and
sweeps after a few seconds, so other tests' deliveries are never swept.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from msgbus_devtools.testkit.bus import RunningBus, running_bus, sample_value
from msgbus_devtools.testkit.subscriber import PeakSubscriber, ScriptedSubscriber
from msgbus_devtools.testkit.waiting import Steady, describe, eventually

from compensator.service import CompensatorService
from msgbus.ids import uuid7
from msgbus.models import DeliveryStatus, Envelope, delivery_id, utcnow
from msgbus.store import documents as docs
from msgbus.store.claims import DeliveryClaims
from msgbus_cli.main import main as cli

SWEEP_AFTER_S = 3.0
FAST_DELAYS_S = [0.3, 0.6, 0.9]
DUE_RETRIES = 2000  # enough that both compensators claim many rounds of 64 side by side


@pytest.fixture(scope="module")
def cbus(mongo_uri: str, kafka_bootstrap: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBus]:
    with running_bus(mongo_uri, tmp_path_factory.mktemp("compensator-bus"), "comp",
                     kafka_bootstrap=kafka_bootstrap,
                     compensator_options={"scan_interval_s": 0.2,
                                          "sweep_after_s": SWEEP_AFTER_S,
                                          "sweep_interval_s": 1.0,
                                          "stats_interval_s": 5.0}) as running:
        yield running


@pytest.fixture(scope="module")
def key(cbus: RunningBus) -> str:
    return cbus.create_app("compensator-tests")


def _destination(cbus: RunningBus, subscriber: ScriptedSubscriber, *, broker: str = "direct",
                 **subscription: Any) -> tuple[str, str]:
    code = f"comp-{uuid.uuid4().hex[:8]}"
    cbus.create_destination(code, broker)
    cbus.subscribe(code, "s", cbus.serve_subscriber(subscriber), **subscription)
    if not subscription.get("paused"):
        cbus.wait_for_workers([f"{code}/s"])
    return code, f"{code}/s"


def _send(cbus: RunningBus, key: str, code: str, count: int) -> list[str]:
    messages = [{"message_id": uuid7(), "destination": code, "body": {"n": n}}
                for n in range(count)]
    response = httpx.post(f"{cbus.receiver_url}/v1/messages", json={"messages": messages},
                          headers={"authorization": f"Bearer {key}"}, timeout=30)
    response.raise_for_status()
    assert all(r["status"] == 202 for r in response.json()["results"])
    return [m["message_id"] for m in messages]


def _status(cbus: RunningBus, sub_id: str, message_id: str) -> str | None:
    doc = cbus.query(cbus.store.db.deliveries.find_one({"_id": delivery_id(message_id, sub_id)}))
    return None if doc is None else str(doc["status"])


def _count(cbus: RunningBus, sub_id: str, status: DeliveryStatus) -> int:
    return int(cbus.query(cbus.store.progress.count_deliveries(sub_id, status)))


def _compensator_metric(cbus: RunningBus, name: str, **labels: str) -> float:
    return sample_value(httpx.get(f"{cbus.compensator_url}/metrics", timeout=10).text, name,
                        labels)


def test_three_failures_then_success_is_delivered_once_after_four_attempts(
        cbus: RunningBus, key: str) -> None:
    subscriber = ScriptedSubscriber(script=lambda nth: 500 if nth <= 3 else 200)
    code, sub_id = _destination(cbus, subscriber, retry_policy={"delays_s": FAST_DELAYS_S})
    ids = _send(cbus, key, code, 5)

    eventually(lambda: _count(cbus, sub_id, DeliveryStatus.DELIVERED) == 5, 30,
               "every message delivered after its retries")
    assert subscriber.successes() == dict.fromkeys(ids, 1)
    for message_id in ids:
        attempts = cbus.query(cbus.store.traces.attempts_of(message_id))
        assert [a["attempt"] for a in attempts] == [1, 2, 3, 4]
        assert [a["status_code"] for a in attempts] == [500, 500, 500, 200]
        gaps = [(b["started_at"] - a["started_at"]).total_seconds()
                for a, b in itertools.pairwise(attempts)]
        # each retry waited for its delay of the schedule (less 10% jitter), not less
        assert all(gap >= delay * 0.9 - 0.05 for gap, delay in zip(gaps, FAST_DELAYS_S,
                                                                    strict=True)), gaps
        delivery = cbus.query(cbus.store.db.deliveries.find_one(
            {"_id": delivery_id(message_id, sub_id)}))
        assert delivery["attempts"] == 4 and delivery["last_status_code"] == 200
    assert _compensator_metric(cbus, "msgbus_retries_total", subscription=sub_id,
                               outcome="delivered") == 5


def test_subscriber_down_for_a_while_gets_every_message_after_it_recovers(
        cbus: RunningBus, key: str) -> None:
    subscriber = ScriptedSubscriber(status=503)
    code, sub_id = _destination(cbus, subscriber, broker="kafka",
                                retry_policy={"delays_s": FAST_DELAYS_S})
    ids = _send(cbus, key, code, 100)
    eventually(lambda: _count(cbus, sub_id, DeliveryStatus.FAILED) >= 10, 30,
               "failures recorded while the subscriber is down")
    eventually(lambda: _compensator_metric(cbus, "msgbus_retries_waiting",
                                           subscription=sub_id) > 0, 10,
               "the compensator's retries-waiting gauge")

    subscriber.status = 200  # it recovers
    eventually(lambda: subscriber.successes().keys() >= set(ids), 60,
               "every message delivered after the recovery")
    eventually(lambda: _count(cbus, sub_id, DeliveryStatus.DELIVERED) == 100, 30,
               "every delivery recorded delivered")


def test_permanent_error_is_parked_then_redriven_to_delivery(cbus: RunningBus,
                                                             key: str) -> None:
    subscriber = ScriptedSubscriber(status=410)
    code, sub_id = _destination(cbus, subscriber, retry_policy={
        "delays_s": FAST_DELAYS_S, "permanent_status_codes": [410]})
    ids = _send(cbus, key, code, 3)
    eventually(lambda: _count(cbus, sub_id, DeliveryStatus.PARKED) == 3, 30, "parked")
    eventually(lambda: _compensator_metric(cbus, "msgbus_parked_deliveries",
                                           subscription=sub_id) == 3, 10, "the parked gauge")
    listed = cbus.admin.get(f"/v1/destinations/{code}/subscriptions/s/parked").json()
    assert {d["message_id"] for d in listed} == set(ids)
    assert len(subscriber.pushes) == 3, "a parked message is not retried"

    subscriber.status = 200
    one = cbus.admin.post(f"/v1/destinations/{code}/subscriptions/s/parked/redrive",
                          json={"message_ids": [ids[0]], "requested_by": "ops-ann"})
    assert one.json() == {"subscription": sub_id, "redriven": 1,
                          "requested_by": "ops-ann (admin-token)"}
    eventually(lambda: _status(cbus, sub_id, ids[0]) == "delivered", 15, "the one re-drive")
    assert _status(cbus, sub_id, ids[1]) == "parked"

    rest = cbus.admin.post(f"/v1/destinations/{code}/subscriptions/s/parked/redrive",
                           json={}).json()
    assert rest["redriven"] == 2
    eventually(lambda: _count(cbus, sub_id, DeliveryStatus.DELIVERED) == 3, 15, "re-drive all")
    assert subscriber.successes() == dict.fromkeys(ids, 1)


def test_max_attempts_parks_and_the_parked_message_is_not_retried_again(
        cbus: RunningBus, key: str) -> None:
    subscriber = ScriptedSubscriber(status=500)
    code, sub_id = _destination(cbus, subscriber, retry_policy={
        "delays_s": [0.2], "max_attempts": 3})
    [message_id] = _send(cbus, key, code, 1)
    eventually(lambda: _status(cbus, sub_id, message_id) == "parked", 20, "parked")
    attempts = cbus.query(cbus.store.traces.attempts_of(message_id))
    assert [a["attempt"] for a in attempts] == [1, 2, 3]


def _lost_message(cbus: RunningBus, code: str, sub_id: str, age_s: float) -> str:
    """A message recorded `age_s` ago with no outcome since, as if its dispatcher had died
    with it."""
    envelope = Envelope(message_id=uuid7(), destination=code, body=b'{"lost": true}',
                        created_at=utcnow() - timedelta(seconds=age_s))
    cbus.query(cbus.store.records.record_messages([(envelope, [sub_id])]))
    cbus.query(cbus.store.db.pending_batches.update_many(
        {"message_ids": envelope.message_id},
        {"$set": {"recorded_at": envelope.created_at}}))
    return envelope.message_id


def test_a_pending_delivery_state_of_an_earlier_version_is_swept_and_delivered(
        cbus: RunningBus) -> None:
    """Versions before the pending batches wrote a pending state per delivery at record time:
    one left behind by an upgrade is still swept."""
    subscriber = ScriptedSubscriber()
    code, sub_id = _destination(cbus, subscriber)
    envelope = Envelope(message_id=uuid7(), destination=code, body=b"{}",
                        created_at=utcnow() - timedelta(seconds=60))
    cbus.query(cbus.store.db.messages.insert_one(docs.message_doc(envelope, [sub_id])))
    cbus.query(cbus.store.db.deliveries.insert_one(
        docs.delivery_doc(envelope, sub_id, envelope.created_at)))
    eventually(lambda: _status(cbus, sub_id, envelope.message_id) == "delivered",
               SWEEP_AFTER_S + 15, "the old pending state swept, pushed and recorded")
    assert subscriber.successes() == {envelope.message_id: 1}


def test_delivery_left_pending_is_swept_and_delivered(cbus: RunningBus) -> None:
    subscriber = ScriptedSubscriber()
    code, sub_id = _destination(cbus, subscriber)
    lost = _lost_message(cbus, code, sub_id, age_s=60)
    recent = _lost_message(cbus, code, sub_id, age_s=0)

    eventually(lambda: subscriber.successes().get(lost) == 1, SWEEP_AFTER_S + 15,
               "the old pending delivery swept and pushed")
    eventually(lambda: _status(cbus, sub_id, lost) == "delivered", 10, "its outcome recorded")
    doc = cbus.query(cbus.store.db.deliveries.find_one({"_id": delivery_id(lost, sub_id)}))
    assert doc["swept_at"] is not None
    # the recent one is swept only once it is older than the threshold
    assert _status(cbus, sub_id, recent) in (None, "failed", "delivered")
    eventually(lambda: _status(cbus, sub_id, recent) == "delivered", SWEEP_AFTER_S + 15,
               "the other one, later")
    assert _compensator_metric(cbus, "msgbus_swept_total", subscription=sub_id) == 2


def test_a_dead_compensators_claims_are_retried_when_their_lease_ends(
        cbus: RunningBus) -> None:
    subscriber = ScriptedSubscriber()
    code, sub_id = _destination(cbus, subscriber, paused=True)
    ids = [_lost_message(cbus, code, sub_id, age_s=1) for _ in range(5)]
    # their first pushes failed
    cbus.query(cbus.store.db.deliveries.insert_many([docs.delivery_doc(
        Envelope(message_id=m, destination=code, body=b"{}"), sub_id, utcnow(),
        DeliveryStatus.FAILED) | {"next_attempt_at": utcnow(), "attempts": 1} for m in ids]))
    # a compensator claims them for 2 s and dies before pushing any
    dead = DeliveryClaims(cbus.store, owner="dead-compensator")
    claimed = cbus.query(dead.claim_due(sub_id, 100, lease_s=2.0))
    assert {c.message_id for c in claimed} == set(ids)
    assert cbus.query(dead.claim_due(sub_id, 100, lease_s=2.0)) == [], "leased: not due"

    cbus.admin.post(f"/v1/destinations/{code}/subscriptions/s/resume").raise_for_status()
    eventually(lambda: subscriber.successes().keys() == set(ids), 20,
               "the live compensator delivering them after the lease")
    assert subscriber.successes() == dict.fromkeys(ids, 1)


def test_two_compensators_share_2000_due_retries_without_duplicates(cbus: RunningBus) -> None:
    subscriber = ScriptedSubscriber()
    code, sub_id = _destination(cbus, subscriber, paused=True, max_concurrency=64)
    _due_retries(cbus, code, sub_id, DUE_RETRIES)

    second: CompensatorService = cbus.new_compensator(instance="second-compensator")
    cbus.query(second.start())
    try:
        cbus.admin.post(f"/v1/destinations/{code}/subscriptions/s/resume").raise_for_status()
        eventually(lambda: len(subscriber.successes()) == DUE_RETRIES, 300, "all delivered")
        eventually(lambda: _count(cbus, sub_id, DeliveryStatus.DELIVERED) == DUE_RETRIES,
                   60, "all recorded delivered")
    finally:
        cbus.query(second.close())
    duplicates = len(subscriber.pushes) - DUE_RETRIES
    assert duplicates == 0, f"{duplicates} duplicate pushes"

    async def retries_by_instance() -> dict[str, int]:
        counts: dict[str, int] = {}
        async for a in cbus.store.db.attempts.find({"subscription": sub_id, "attempt": 2},
                                                   {"instance": 1}):
            counts[a["instance"]] = counts.get(a["instance"], 0) + 1
        return counts

    counts = cbus.query(retries_by_instance())
    assert sum(counts.values()) == DUE_RETRIES
    assert len(counts) == 2 and min(counts.values()) > 0, f"one compensator did all: {counts}"


def _due_retries(cbus: RunningBus, code: str, sub_id: str, count: int) -> list[str]:
    """`count` messages of `code` whose first push to `sub_id` failed, each due now."""
    now = utcnow()
    envelopes = [Envelope(message_id=uuid7(), destination=code, body=b"{}",
                          created_at=now - timedelta(seconds=5)) for _ in range(count)]
    for at in range(0, count, 500):  # one insert of 5,000 outlived 30 s on a busy server
        part = envelopes[at:at + 500]
        cbus.query(cbus.store.db.messages.insert_many([docs.message_doc(e, [sub_id])
                                                       for e in part]))
        cbus.query(cbus.store.db.deliveries.insert_many([docs.delivery_doc(e, sub_id, now) | {
            "status": "failed", "next_attempt_at": now, "attempts": 1} for e in part]))
    return [e.message_id for e in envelopes]


def test_a_large_due_backlog_does_not_hold_back_another_subscriptions_retries(
        cbus: RunningBus) -> None:
    """One scan per round finds every subscription with something due, and each drains in a
    task of its own under its own cap: a few retries of one subscription are delivered while
    another's 400 still drain, slowly (2 at a time, 250 ms each: 50 s at least, so that a
    stalled MongoDB stand-in cannot let the backlog drain first)."""
    slow = PeakSubscriber(delay_s=0.25)
    big_code, big_sub = _destination(cbus, slow, paused=True, max_concurrency=2)
    _due_retries(cbus, big_code, big_sub, 400)
    cbus.admin.post(f"/v1/destinations/{big_code}/subscriptions/s/resume").raise_for_status()
    eventually(lambda: len(slow.pushes) >= 8, 120, "the large backlog draining",
               progress=lambda: f"{len(slow.pushes)} pushed")

    quick = ScriptedSubscriber()
    code, sub_id = _destination(cbus, quick, paused=True)
    ids = _due_retries(cbus, code, sub_id, 5)
    cbus.admin.post(f"/v1/destinations/{code}/subscriptions/s/resume").raise_for_status()
    eventually(lambda: quick.successes().keys() == set(ids), 60,
               "the other subscription's retries delivered",
               progress=lambda: f"{len(quick.successes())} of 5; the backlog {len(slow.pushes)}")
    assert len(slow.pushes) < 380, "the large backlog had drained first: nothing was shown"
    assert slow.peak <= 2
    # the rest would drain beside the next tests of this bus
    cbus.admin.post(f"/v1/destinations/{big_code}/subscriptions/s/pause").raise_for_status()


def _settled(value: Any, quiet_s: float = 1.5, timeout_s: float = 15) -> Any:
    """The value of `value()` once it has not changed for `quiet_s` (to show that something
    stopped, a wait is the only way)."""
    steady = Steady(value, quiet_s)
    eventually(steady, timeout_s, f"{describe(value)} to stop changing", interval_s=0.1,
               progress=lambda: f"last {steady.last}")
    return steady.last


def _replay(cbus: RunningBus, code: str, since: Any, until: Any, **options: Any) -> Any:
    return cbus.admin.post("/v1/replays", json={
        "destination": code, "since": since.isoformat(), "until": until.isoformat(),
        **options})


def _job(cbus: RunningBus, replay_id: str) -> dict[str, Any]:
    return dict(cbus.admin.get(f"/v1/replays/{replay_id}").json())


def test_replay_of_a_range_matches_its_dry_run_respects_its_rate_and_is_audited(
        cbus: RunningBus, key: str) -> None:
    subscriber = ScriptedSubscriber()
    code, sub_id = _destination(cbus, subscriber)
    since = utcnow()
    ids = _send(cbus, key, code, 30)
    eventually(lambda: _count(cbus, sub_id, DeliveryStatus.DELIVERED) == 30, 30, "delivered")
    until = utcnow()
    before = _send(cbus, key, code, 1)  # outside the range: not replayed
    eventually(lambda: subscriber.successes().get(before[0]) == 1, 30, "delivered")

    dry = _replay(cbus, code, since, until, dry_run=True).json()
    assert dry["planned"] == 30 and dry["subscriptions"] == [sub_id]
    only_failed = _replay(cbus, code, since, until, dry_run=True, statuses=["failed"]).json()
    assert only_failed["planned"] == 0
    assert cbus.admin.get("/v1/replays").json() == [], "a dry run creates no job"
    backwards = _replay(cbus, code, until, since)
    assert backwards.status_code == 422
    assert backwards.json()["message"].endswith("until must be after since")
    unknown = _replay(cbus, code, since, until, subscriptions=["nobody"])
    assert unknown.status_code == 404 and "'nobody'" in unknown.json()["message"]
    job = _replay(cbus, code, since, until, rate_per_s=10, requested_by="ops-bob").json()
    assert job["state"] == "planned" and job["planned"] == 30
    cbus.admin.post(f"/v1/replays/{job['replay_id']}/start",
                    json={"requested_by": "ops-bob"}).raise_for_status()
    eventually(lambda: _job(cbus, job["replay_id"])["state"] == "done", 30, "replay done")

    done = _job(cbus, job["replay_id"])
    assert done["done"] == done["planned"] == 30 and done["delivered"] == 30
    bob = "ops-bob (admin-token)"  # the bootstrap token, and the name the caller gave
    assert [(a["by"], a["action"]) for a in done["audit"]] == [
        (bob, "created"), (bob, "running"), (done["audit"][2]["by"], "done")]
    assert done["audit"][0]["planned"] == done["audit"][-1]["done"] == 30  # how many
    assert subscriber.successes() == {**dict.fromkeys(ids, 2), before[0]: 1}
    replayed = sorted(t for m, _, t in subscriber.answered[31:] if m in set(ids))
    # 10/s with one second of burst: the last 20 of 30 take about 2 s
    assert replayed[-1] - replayed[0] >= 1.5, "the replay ran faster than its rate limit"
    attempts = cbus.query(cbus.store.traces.attempts_of(ids[0]))
    assert any(f"replay {job['replay_id']}" in a["instance"] for a in attempts)


def test_replay_can_be_paused_resumed_and_cancelled(cbus: RunningBus, key: str) -> None:
    subscriber = ScriptedSubscriber()
    code, sub_id = _destination(cbus, subscriber)
    since = utcnow()
    _send(cbus, key, code, 40)
    eventually(lambda: _count(cbus, sub_id, DeliveryStatus.DELIVERED) == 40, 30, "delivered")
    job = _replay(cbus, code, since, utcnow(), rate_per_s=4).json()
    replay_id = job["replay_id"]
    cbus.admin.post(f"/v1/replays/{replay_id}/start").raise_for_status()
    eventually(lambda: _job(cbus, replay_id)["done"] >= 4, 20, "replay under way")

    cbus.admin.post(f"/v1/replays/{replay_id}/pause").raise_for_status()
    paused_at = _settled(lambda: len(subscriber.pushes))
    assert paused_at == 40 + _job(cbus, replay_id)["done"]
    conflict = cbus.admin.post(f"/v1/replays/{replay_id}/start")
    assert conflict.status_code == 409 and "paused" in conflict.json()["message"]

    cbus.admin.post(f"/v1/replays/{replay_id}/resume").raise_for_status()
    eventually(lambda: len(subscriber.pushes) > paused_at, 10, "pushes again after resume")
    cbus.admin.post(f"/v1/replays/{replay_id}/cancel").raise_for_status()
    assert _settled(lambda: len(subscriber.pushes)) == 40 + _job(cbus, replay_id)["done"]
    final = _job(cbus, replay_id)
    assert final["state"] == "cancelled" and final["done"] < final["planned"] == 40
    assert [a["action"] for a in final["audit"]] == [
        "created", "running", "paused", "running", "cancelled"]


def test_replay_and_redrive_from_the_cli(cbus: RunningBus, key: str, tmp_path: Path) -> None:
    subscriber = ScriptedSubscriber()
    code, sub_id = _destination(cbus, subscriber)
    since = utcnow()
    ids = _send(cbus, key, code, 5)
    eventually(lambda: _count(cbus, sub_id, DeliveryStatus.DELIVERED) == 5, 30, "delivered")
    admin = ["--admin", cbus.admin_url, "--token", cbus.admin_token]
    window = ["--since", since.isoformat(), "--until", utcnow().isoformat()]
    runner = CliRunner()

    plan = runner.invoke(cli, ["replay", "plan", *admin, code, *window])
    assert plan.exit_code == 0, plan.output
    assert plan.output.startswith(f"5 pushes to {sub_id}")
    run = runner.invoke(cli, ["replay", "run", *admin, code, *window, "--rate", "50", "--yes",
                              "--by", "ops-cli"])
    assert run.exit_code == 0, run.output
    assert "done" in run.output and "5/5 pushed" in run.output
    assert subscriber.successes() == dict.fromkeys(ids, 2)

    bad = runner.invoke(cli, ["replay", "plan", *admin, "no-such-dest", *window])
    assert bad.exit_code == 1 and "404" in bad.output and "no-such-dest" in bad.output

    redrive = runner.invoke(cli, ["parked", "redrive", *admin, code, "s"])
    assert redrive.exit_code == 0 and "0 re-driven" in redrive.output
