"""A subscription's promises hold with every service running as several OS processes.

One concurrency cap and one rate limit per subscription, whatever pushes to it: three
dispatchers and two compensators as separate OS processes, and a replay running in a
compensator, push to subscriptions with `max_concurrency: 4` (one on Kafka, one on RabbitMQ)
and to one also limited to `max_rate_per_s: 20`; each subscriber answers in 100 ms and counts
the pushes it has at once and begins per second. Every fifth message fails its first push (the
compensators retry it), and one dispatcher is killed with SIGKILL mid-run: its shares go to the
others when its lease ends. One deployment serves all three, to start its processes once.

One circuit per subscription: a subscriber that fails every message's first push and accepts
its retry gets everything, though the dispatchers only ever see it fail."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import orjson
import pytest
from msgbus_devtools.testkit.bus import sample_value
from msgbus_devtools.testkit.deployment import SUBSCRIPTION, Deployment, Servers, wait_with_progress
from msgbus_devtools.testkit.procs import say
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.subscriber import PeakSubscriber, RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually

from admin.pushers import pushers_of
from msgbus.ids import uuid7
from msgbus.models import BrokerKind, ReplaySpec, ReplayState, utcnow
from msgbus.store.replays import ReplayStore
from msgbus_cli.asgi import answer_lifespan, read_body, request_headers, respond

# timing-sensitive load: run alone (scripts/test.sh); the hang guard leaves room for a slow machine
pytestmark = [pytest.mark.serial, pytest.mark.timeout(600)]

CAP = 4
RATE = 20
PUSH_S = 0.1
MESSAGES = 200  # per destination
LEASE_S = 3.0
UNIQUE = uuid.uuid4().hex[:6]
CAPPED = {f"cap-k-{UNIQUE}": BrokerKind.KAFKA, f"cap-r-{UNIQUE}": BrokerKind.RABBITMQ}
RATED = f"rate-k-{UNIQUE}"


def _fails_first(message_id: str) -> bool:
    return int(message_id[-2:], 16) % 5 == 0


@pytest.fixture
def deployment(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(private_servers, tmp_path, {**CAPPED, RATED: BrokerKind.KAFKA})
    deployed.subscriber_factory = lambda: PeakSubscriber(delay_s=PUSH_S,
                                                         fails_first=_fails_first)
    # a long timeout: a push the dispatcher gave up on while the subscriber still works on it
    # would free its slot early (on a loaded machine the subscriber's loop lags)
    deployed.subscription_options = {"max_concurrency": CAP, "timeout_ms": 60_000,
                                     "retry_policy": {"delays_s": [1.0]}}
    deployed.options_of = {RATED: {"max_rate_per_s": RATE}}
    deployed.extra_env = {"MSGBUS_SHARE_HEARTBEAT_S": "0.5",
                          "MSGBUS_SHARE_LEASE_S": str(LEASE_S)}
    yield deployed
    deployed.close()


def _start_replay(deployment: Deployment, code: str, since_s: float) -> None:
    """A running replay of everything sent so far, pushed by a compensator beside its
    retries."""
    now = utcnow()
    spec = ReplaySpec(destination=code, since=now - timedelta(seconds=since_s),
                      until=now + timedelta(seconds=1), rate_per_s=50)
    replays = ReplayStore(deployment.store)

    async def start() -> None:
        job = await replays.create(spec, [f"{code}/{SUBSCRIPTION}"], 0, "test")
        await replays.transition(job["_id"], (ReplayState.PLANNED,), ReplayState.RUNNING,
                                 "test")

    deployment.run(start())


def _pushers(deployment: Deployment, code: str) -> dict[str, int]:
    view = deployment.run(pushers_of(deployment.store, f"{code}/{SUBSCRIPTION}"))
    return {p["instance"]: p["share"] for p in view["pushers"]}


def test_dispatchers_compensators_and_a_replay_share_one_cap_and_one_rate(
        deployment: Deployment) -> None:
    deployment.start(receivers=1)
    more = [deployment.add_dispatcher("dispatcher-1"), deployment.add_dispatcher("dispatcher-2"),
            deployment.add_compensator("compensator-1", scan_interval_s="0.5")]
    for process in more:
        process.start()
    subscribers = {code: deployment.subscribers[code] for code in deployment.destinations}
    began = time.monotonic()
    load = deployment.load(rate_per_s=len(subscribers) * MESSAGES / 2,
                           messages=len(subscribers) * MESSAGES).start()
    load.join()
    accepted = {code: load.accepted_ids(code) for code in subscribers}
    assert set(load.statuses()) == {"202"}, load.summary()
    assert all(len(ids) == MESSAGES for ids in accepted.values()), load.summary()
    capped_kafka = next(iter(CAPPED))
    _start_replay(deployment, capped_kafka, time.monotonic() - began + 5)

    dispatchers = {f"dispatcher:dispatcher{n}" for n in ("", "-1", "-2")}
    eventually(lambda: dispatchers <= set(_pushers(deployment, capped_kafka)), 30,
               "the three dispatchers among the subscription's pushers")
    eventually(lambda: len(subscribers[capped_kafka].pushes) >= MESSAGES // 3, 60,
               "a third of the pushes")
    more[0].kill9()  # dispatcher-1, mid-run
    eventually(lambda: "dispatcher:dispatcher-1" not in _pushers(deployment, capped_kafka),
               10 * LEASE_S, "the killed dispatcher gone from the pushers after its lease")

    def delivered() -> tuple[int, int]:
        return (sum(len(ids & set(subscribers[code].successes()))
                    for code, ids in accepted.items()), sum(map(len, accepted.values())))

    wait_with_progress("every message delivered", delivered, 120)
    took_s = time.monotonic() - began
    for code, subscriber in subscribers.items():
        assert isinstance(subscriber, PeakSubscriber)
        say(f"{code}: {len(subscriber.pushes)} pushes in {took_s:.1f} s, at most "
            f"{subscriber.peak} at once and {subscriber.busiest_second()} begun in one second")
        assert subscriber.peak <= CAP, code
        assert sum(_pushers(deployment, code).values()) <= CAP, code
    for code in CAPPED:
        assert subscribers[code].peak == CAP, code  # the cap is used, not only respected
    rated = subscribers[RATED]
    assert isinstance(rated, PeakSubscriber)
    assert rated.busiest_second() <= RATE + 1  # +1: a push at each edge of the window
    assert rated.busiest_second() >= 0.8 * RATE  # the rate is used while a backlog waits


# ---- one circuit per subscription -------------------------------------------------------------

FIRST_FAILS = 800  # messages per destination
FIRST_FAILS_DESTINATIONS = {f"cb-k-{UNIQUE}": BrokerKind.KAFKA,
                            f"cb-r-{UNIQUE}": BrokerKind.RABBITMQ}


@pytest.fixture
def fails_first(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(private_servers, tmp_path, FIRST_FAILS_DESTINATIONS)
    deployed.subscriber_factory = lambda: PeakSubscriber(delay_s=0, fails_first=lambda _: True)
    # the default retry policy and circuit: the first retry comes 10 s after the failure
    deployed.subscription_options = {"max_concurrency": 16}
    yield deployed
    deployed.close()


def _attempts_per_message(deployment: Deployment, code: str) -> Counter[int]:
    """How many messages of `code` have how many attempts on their trace."""
    async def count() -> Counter[int]:
        cursor = await deployment.store.db.attempts.aggregate([
            {"$match": {"subscription": f"{code}/{SUBSCRIPTION}"}},
            {"$group": {"_id": "$message_id", "n": {"$sum": 1}}}])
        return Counter([doc["n"] async for doc in cursor])
    return deployment.run(count())


def test_a_subscriber_failing_every_first_push_still_gets_everything(
        fails_first: Deployment) -> None:
    """Two dispatchers see only failures, two compensators only successes: the circuit, one
    per subscription, hears the retries' successes and stays closed."""
    deployment = fails_first
    deployment.start(receivers=1)
    for process in (deployment.add_dispatcher("dispatcher-1"),
                    deployment.add_compensator("compensator-1", scan_interval_s="0.5")):
        process.start()
    subscribers = deployment.subscribers
    load = deployment.load(rate_per_s=2 * FIRST_FAILS / 10, messages=2 * FIRST_FAILS).start()
    load.join()
    assert set(load.statuses()) == {"202"}, load.summary()
    accepted = {code: load.accepted_ids(code) for code in subscribers}
    assert all(len(ids) == FIRST_FAILS for ids in accepted.values()), load.summary()
    total = sum(map(len, accepted.values()))

    def delivered() -> tuple[int, int]:
        return (sum(len(ids & set(subscribers[code].successes()))
                    for code, ids in accepted.items()), total)

    with deployment.logs_on_failure():
        wait_with_progress("every message delivered, within 2 minutes of the last send",
                           delivered, 120)
    assert load.finished_at is not None
    say(f"{total} messages delivered {time.monotonic() - load.finished_at:.1f} s "
        f"after the last send ({load.summary()})")
    for code, subscriber in subscribers.items():
        assert set(subscriber.successes().values()) == {1}, f"{code}: delivered twice"
        pushes = Counter(push.message_id for push in subscriber.pushes)
        assert set(pushes.values()) == {2}, f"{code}: pushes per message {Counter(pushes.values())}"

        def traced(code: str = code) -> tuple[int, int]:
            return _attempts_per_message(deployment, code)[2], len(accepted[code])

        wait_with_progress(f"{code}: two attempts on each trace", traced, 60)


# ---- order per biz_id ---------------------------------------------------------------------------

KEYS, PER_KEY = 20, 15
STUCK_KEY, STUCK_S = "key-0", 12.0  # its head fails this long, four times the sweep threshold
QUORUM_STUCK_S = 20.0
SWEEP_AFTER_S = 3.0
ORDERED_DESTINATIONS = {f"ord-k-{UNIQUE}": BrokerKind.KAFKA, f"ord-r-{UNIQUE}": BrokerKind.RABBITMQ}


@dataclass
class KeyedSubscriber(RecordingSubscriber):
    """Records (biz_id, n, status, when) of each push in arrival order; the head of STUCK_KEY
    is answered 500 for STUCK_S after its first push, everything else 200."""

    log: list[tuple[str, int, int, float]] = field(default_factory=list)
    stuck_since: float | None = None
    stuck_s: float = STUCK_S

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answer_lifespan(scope, receive, send):
            return
        n = orjson.loads(await read_body(receive))["n"]
        key = request_headers(scope)["ce-bizid"]
        now = time.monotonic()
        with self._lock:
            status = 200
            if key == STUCK_KEY and n == 0:
                self.stuck_since = self.stuck_since or now
                status = 500 if now - self.stuck_since < self.stuck_s else 200
            self.log.append((key, n, status, now))
        await respond(send, status, b"")

    def delivered(self) -> int:
        with self._lock:
            return len({(key, n) for key, n, status, _ in self.log if status == 200})

    def arrivals(self) -> list[tuple[str, int, int, float]]:
        with self._lock:
            return list(self.log)


def _ordered_deployment(servers: Servers, tmp_path: Path,
                        destinations: dict[str, BrokerKind]) -> Deployment:
    """Ordered subscriptions whose heads retry after 1 s, and a compensator that sweeps stale
    pending deliveries every second."""
    deployed = Deployment(servers, tmp_path, destinations)
    deployed.subscriber_factory = KeyedSubscriber
    deployed.subscription_options = {"ordered_by_biz_id": True, "max_concurrency": 8,
                                     "retry_policy": {"delays_s": [1.0]}}
    deployed.compensator_settings = {"scan_interval_s": "0.5",
                                     "sweep_after_s": str(SWEEP_AFTER_S),
                                     "sweep_interval_s": "1"}
    return deployed


@pytest.fixture
def ordered(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    deployed = _ordered_deployment(private_servers, tmp_path, ORDERED_DESTINATIONS)
    yield deployed
    deployed.close()


def _key_history(deployment: Deployment, code: str, key: str) -> list[tuple[Any, ...]]:
    """The attempts of one key's messages: (n, instance, attempt, status), oldest first."""
    async def read() -> list[tuple[Any, ...]]:
        messages = {d["_id"]: orjson.loads(d["body"])["n"] async for d in
                    deployment.store.db.messages.find({"destination": code, "biz_id": key})}
        cursor = deployment.store.db.attempts.find({"message_id": {"$in": list(messages)}})
        return [(messages[a["message_id"]], a.get("instance"), a.get("attempt"),
                 a.get("status_code"), a["started_at"].time().isoformat())
                for a in sorted([a async for a in cursor], key=lambda a: a["started_at"])]
    return deployment.run(read())


def _send_in_key_order(deployment: Deployment, code: str) -> None:
    """Each key's messages n = 0, 1, ... one after the other; keys interleaved."""
    messages = [{"message_id": uuid7(), "destination": code, "biz_id": f"key-{k}",
                 "body": {"n": n}}
                for n in range(PER_KEY) for k in range(KEYS)]
    post_batches(deployment.receivers[0].url, deployment.api_key, messages)


def test_order_per_biz_id_holds_with_three_dispatchers_and_the_sweep(ordered: Deployment
                                                                      ) -> None:
    """Three dispatchers (Kafka: a partition each; RabbitMQ: one consumer at a time of the
    ordered queue) and a compensator whose stale-pending sweep runs every second with a 3 s
    threshold, while one key's head fails for 12 s: that key's later messages wait for it,
    the other keys flow."""
    deployment = ordered
    deployment.start(receivers=1)
    for name in ("dispatcher-1", "dispatcher-2"):
        deployment.add_dispatcher(name).start()
    for code in ORDERED_DESTINATIONS:
        _send_in_key_order(deployment, code)
    subscribers = {code: cast(KeyedSubscriber, deployment.subscribers[code])
                   for code in ORDERED_DESTINATIONS}

    def delivered() -> tuple[int, int]:
        return (sum(s.delivered() for s in subscribers.values()),
                len(subscribers) * KEYS * PER_KEY)

    with deployment.logs_on_failure():
        wait_with_progress("every message delivered", delivered, 120)
    _assert_each_key_in_order(deployment, subscribers)


def _assert_each_key_in_order(deployment: Deployment,
                              subscribers: dict[str, KeyedSubscriber]) -> None:
    for code, subscriber in subscribers.items():
        succeeded: dict[str, list[int]] = {}
        for key, n, status, _ in subscriber.arrivals():
            done = succeeded.setdefault(key, [])
            assert n <= len(done), (f"{code}: {key}'s message {n} was pushed while message "
                                    f"{len(done)} had not succeeded yet; its pushes: "
                                    f"{_key_history(deployment, code, key)}")
            if status == 200 and n == len(done):
                done.append(n)
        assert all(done == list(range(PER_KEY)) for done in succeeded.values()), code
        head_done = min(at for key, n, status, at in subscriber.arrivals()
                        if (key, n, status) == (STUCK_KEY, 0, 200))
        others_done = max(at for key, n, status, at in subscriber.arrivals()
                          if key != STUCK_KEY and status == 200)
        assert others_done < head_done, f"{code}: the other keys waited for the stuck one"


QUORUM_ORDERED = f"ord-q-{UNIQUE}"


@pytest.fixture
def ordered_quorum(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    deployed = _ordered_deployment(private_servers, tmp_path,
                                   {QUORUM_ORDERED: BrokerKind.RABBITMQ})
    # the other keys' messages also wait out the killed dispatcher's hand-over (its connection's
    # end, the next single active consumer); 12 s was 0.13 s short once on a machine at half speed
    deployed.subscriber_factory = lambda: KeyedSubscriber(stuck_s=QUORUM_STUCK_S)
    deployed.extra_env = {"MSGBUS_RABBITMQ_QUEUE_TYPE": "quorum"}
    yield deployed
    deployed.close()


def test_order_per_biz_id_holds_on_a_quorum_queue_when_the_active_dispatcher_dies(
        ordered_quorum: Deployment) -> None:
    """Quorum queues ignore exclusive consumers; an ordered one is declared with single active
    consumer. Three dispatchers consume it; the first, the active one, is killed (-9) while it
    holds the stuck key's later messages unacked: the broker hands them, in order, to the
    next, and every key's messages still succeed one after the other."""
    deployment = ordered_quorum
    deployment.start(receivers=1)
    for name in ("dispatcher-1", "dispatcher-2"):
        deployment.add_dispatcher(name).start()
    _send_in_key_order(deployment, QUORUM_ORDERED)
    subscriber = cast(KeyedSubscriber, deployment.subscribers[QUORUM_ORDERED])
    total = KEYS * PER_KEY
    with deployment.logs_on_failure():
        wait_with_progress("a third delivered", lambda: (subscriber.delivered(), total // 3), 60)
        assert deployment.dispatcher is not None
        deployment.dispatcher.kill9()
        wait_with_progress("every message delivered", lambda: (subscriber.delivered(), total),
                           120)
    _assert_each_key_in_order(deployment, {QUORUM_ORDERED: subscriber})
    pushed_by = _pushed_by(deployment, QUORUM_ORDERED)
    assert "dispatcher" in pushed_by and {"dispatcher-1", "dispatcher-2"} & pushed_by, pushed_by


def _pushed_by(deployment: Deployment, code: str) -> set[str]:
    async def read() -> set[str]:
        found = await deployment.store.db.attempts.distinct(
            "instance", {"subscription": f"{code}/{SUBSCRIPTION}"})
        return {str(instance) for instance in found}

    return deployment.run(read())


# ---- one message id, one delivery, across receivers ---------------------------------------------

DEDUPE_DESTINATIONS = {f"dd-k-{UNIQUE}": BrokerKind.KAFKA, f"dd-r-{UNIQUE}": BrokerKind.RABBITMQ,
                       f"dd-d-{UNIQUE}": BrokerKind.DIRECT}
PER_DESTINATION = 150


@pytest.fixture
def two_receivers(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(private_servers, tmp_path, DEDUPE_DESTINATIONS)
    yield deployed
    deployed.close()


def test_a_message_id_sent_to_two_receivers_is_delivered_once(two_receivers: Deployment
                                                              ) -> None:
    """Each message goes to both receiver processes — half of them to both at once, half
    to the second after the first answered (a client's re-send through a load balancer) —
    on Kafka, RabbitMQ and the direct path: every subscriber gets each once."""
    deployment = two_receivers
    deployment.start(receivers=2)
    urls = [receiver.url for receiver in deployment.receivers]

    def batch() -> list[dict[str, Any]]:
        return [{"message_id": uuid7(), "destination": code, "body": {"n": n}}
                for code in DEDUPE_DESTINATIONS for n in range(PER_DESTINATION // 2)]

    together, one_after_the_other = batch(), batch()
    senders = [threading.Thread(target=post_batches, args=(url, deployment.api_key, together))
               for url in urls]
    for sender in senders:
        sender.start()
    for url in urls:
        post_batches(url, deployment.api_key, one_after_the_other)
    for sender in senders:
        sender.join(60)
    sent = together + one_after_the_other

    def duplicates_caught() -> tuple[int, int]:
        counted = 0
        for receiver in deployment.receivers:
            text = httpx.get(f"{receiver.url}/metrics", timeout=10).text
            counted += int(sum(sample_value(text, "msgbus_messages_duplicate_total",
                                            {"destination": code})
                               for code in DEDUPE_DESTINATIONS))
        return counted, len(sent)

    with deployment.logs_on_failure():
        wait_with_progress("the second copy of each message caught", duplicates_caught, 60)
    for code, subscriber in deployment.subscribers.items():
        wanted = {m["message_id"] for m in sent if m["destination"] == code}
        eventually(lambda s=subscriber, w=wanted: s.message_ids() >= w, 60,
                   f"{code}: every message delivered")
        pushes = Counter(push.message_id for push in subscriber.pushes)
        assert set(pushes.values()) == {1}, f"{code}: pushed twice: {pushes.most_common(3)}"


# ---- broker switches are drained, not timed ------------------------------------------------------

SWITCHED = f"abca-{UNIQUE}"


@pytest.fixture
def switching(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(private_servers, tmp_path, {SWITCHED: BrokerKind.KAFKA},
                          subscription_names=(SUBSCRIPTION, "paused"))
    deployed.extra_env = {"MSGBUS_DISPATCHER_DRAIN_SETTLE_S": "2",
                          "MSGBUS_DISPATCHER_DRAIN_CHECK_INTERVAL_S": "0.5"}
    # what the direct path could not hand to the paused subscription is swept once it resumes
    deployed.compensator_settings = {"scan_interval_s": "0.5", "sweep_after_s": "3",
                                     "sweep_interval_s": "1"}
    yield deployed
    deployed.close()


def _set_paused(deployment: Deployment, name: str, paused: bool) -> None:
    async def change() -> None:
        sub = await deployment.store.config.get_subscription(f"{SWITCHED}/{name}")
        await deployment.store.config.save_subscription(
            sub.model_copy(update={"paused": paused, "updated_at": utcnow()}))
    deployment.run(change())


def _switch(deployment: Deployment, broker: BrokerKind) -> None:
    async def change() -> None:
        destination = await deployment.store.config.get_destination(SWITCHED)
        await deployment.store.config.save_destination(destination.with_broker(broker, utcnow()))
    deployment.run(change())


def _retired(deployment: Deployment) -> list[BrokerKind]:
    destination = deployment.run(deployment.store.config.get_destination(SWITCHED))
    return [r.broker for r in destination.retired]


def test_switches_a_b_c_a_under_load_lose_nothing_and_a_paused_subscription_gets_its_backlog(
        switching: Deployment) -> None:
    """Kafka → RabbitMQ → direct → Kafka while messages flow, with two dispatchers: the active
    subscription gets everything; the paused one keeps what waits in the retired RabbitMQ queue
    and gets all of it once resumed; then nothing is left retired."""
    deployment = switching
    deployment.start(receivers=1)
    deployment.add_dispatcher("dispatcher-1").start()
    _set_paused(deployment, "paused", True)
    load = deployment.load(rate_per_s=50, duration_s=16).start()
    for at_s, broker in ((4, BrokerKind.RABBITMQ), (8, BrokerKind.DIRECT), (12, BrokerKind.KAFKA)):
        eventually(lambda at=at_s: load.elapsed_s() >= at, 30, f"{at_s} s of load")
        _switch(deployment, broker)
    load.join()
    accepted = load.accepted_ids(SWITCHED)
    assert set(load.statuses()) == {"202"}, load.summary()
    active = deployment.subscriber_of[f"{SWITCHED}/{SUBSCRIPTION}"]
    paused = deployment.subscriber_of[f"{SWITCHED}/paused"]

    def got(subscriber: RecordingSubscriber) -> Callable[[], tuple[int, int]]:
        return lambda: (len(subscriber.message_ids() & accepted), len(accepted))

    with deployment.logs_on_failure():
        wait_with_progress("the active subscription getting everything", got(active), 120)
        assert _retired(deployment) == [BrokerKind.RABBITMQ], "drained for the paused one too"
        _set_paused(deployment, "paused", False)
        wait_with_progress("the resumed subscription getting everything", got(paused), 120)
        eventually(lambda: _retired(deployment) == [], 60, "the retired brokers drained")
