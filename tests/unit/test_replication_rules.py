"""The rules that decide whether a topic or queue keeps the copies asked for
(msgbus/replication.py), the queue shapes msgbus declares, and the settings that go with them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from msgbus.brokers._rabbit_consumer import QueueShape
from msgbus.models import Subscription
from msgbus.replication import QueueCopies, TopicCopies, Wanted, describe_queue, topic_problems
from msgbus.settings import ConnectionSettings, ReceiverSettings

PROD = Wanted(kafka_replication_factor=3, kafka_min_insync_replicas=2,
              rabbitmq_queue_type="quorum")


def topic(rf: int, isr: int, min_isr: int | None) -> TopicCopies:
    return TopicCopies(topic="t", exists=True, partitions=4, replication_factor=rf,
                       fewest_in_sync=isr, min_insync_replicas=min_isr)


def test_a_topic_with_the_copies_asked_for_has_no_problem() -> None:
    assert topic_problems(topic(3, 3, 2), PROD) == []
    assert topic_problems(topic(3, 2, 2), PROD) == []  # one replica behind: still acked
    assert topic_problems(topic(1, 1, None), Wanted()) == []  # nothing asked for


def test_a_topic_short_of_copies_says_which() -> None:
    assert topic_problems(topic(1, 1, 1), PROD) == [
        "topic t: 1 replica(s) per partition, 3 asked for",
        "topic t: min.insync.replicas 1, 2 asked for",
        "topic t: a partition has 1 in-sync replica(s), below min.insync.replicas 2: "
        "acks=all publishes are refused"]
    # the topic's own min.insync.replicas counts even when the settings ask for none
    assert topic_problems(topic(3, 1, 2), Wanted()) == [
        "topic t: a partition has 1 in-sync replica(s), below min.insync.replicas 2: "
        "acks=all publishes are refused"]


def queue_doc(kind: str, members: int = 0, online: int = 0,
              single_active: bool = False) -> dict[str, object]:
    nodes = [f"rabbit@n{i}" for i in range(members)]
    args = {"x-queue-type": kind, **({"x-single-active-consumer": True} if single_active else {})}
    return {"name": "msgbus.d.s", "type": kind, "members": nodes, "online": nodes[:online],
            "arguments": args}


def problems(doc: dict[str, object] | None, ordered: bool, wanted: Wanted = PROD) -> list[str]:
    sub = Subscription(destination="d", name="s", url="http://127.0.0.1:9/hook",
                       ordered_by_biz_id=ordered)
    copies: QueueCopies = describe_queue(sub, {"msgbus.d.s": doc} if doc else {}, wanted)
    return copies.problems


def test_queue_problems() -> None:
    assert problems(queue_doc("quorum", 3, 3), ordered=False) == []
    assert problems(queue_doc("quorum", 3, 3, single_active=True), ordered=True) == []
    assert problems(queue_doc("classic"), ordered=False) == [
        "queue msgbus.d.s: classic (one copy) where quorum was asked for"]
    assert problems(queue_doc("classic"), ordered=False, wanted=Wanted()) == []
    assert problems(queue_doc("quorum", 3, 3), ordered=True) == [
        "queue msgbus.d.s: an ordered subscription's quorum queue without single active "
        "consumer: per-key order is not kept"]
    assert problems(queue_doc("quorum", 3, 2), ordered=False) == [
        "queue msgbus.d.s: quorum members offline: rabbit@n2"]
    assert problems(None, ordered=False) == []  # not declared yet


def test_queue_shapes() -> None:
    assert QueueShape.wanted("classic", ordered=True).arguments() == {}
    assert QueueShape.wanted("quorum", ordered=False).arguments() == {"x-queue-type": "quorum"}
    assert QueueShape.wanted("quorum", ordered=True).arguments() == {
        "x-queue-type": "quorum", "x-single-active-consumer": True}


def test_min_insync_replicas_needs_acks_all() -> None:
    conn = ConnectionSettings(kafka_min_insync_replicas=2)
    assert ReceiverSettings(connections=conn).kafka_acks == "all"
    with pytest.raises(ValidationError, match="needs MSGBUS_RECEIVER_KAFKA_ACKS=all"):
        ReceiverSettings(connections=conn, kafka_acks="1")
    with pytest.raises(ValidationError):
        ConnectionSettings(rabbitmq_queue_type="stream")  # type: ignore[arg-type]
