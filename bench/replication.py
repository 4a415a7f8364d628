"""What a quorum queue costs the receiver's publish: messages/s through `RabbitPublisher`
(persistent, publisher confirms, batches of 500 as the flush publishes them) into a destination
with two subscription queues, classic against quorum, alternating per run on the machine's
RabbitMQ (which goes first alternates); then quorum ÷ classic, paired per run
(min/median/max).

    python -m bench.replication [--runs 3] [--messages 20000]

One RabbitMQ node here: a quorum queue has one member, so this is the cost of the Raft log
and its fsyncs, not of replication over a network (which adds a round trip to a majority).
The exchanges and queues it declares are deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import pika
from msgbus_devtools import servers as services

from bench.report import out, say
from msgbus.brokers.base import consumer_name, topic_name
from msgbus.brokers.rabbitmq import QueueType, RabbitPublisher
from msgbus.ids import uuid7
from msgbus.models import BrokerKind, Destination, Envelope, Subscription

BATCH = 500
SUBSCRIPTIONS = ("a", "b")


async def publish_rate(url: str, queue_type: QueueType, messages: int) -> float:
    """Messages/s confirmed into a fresh destination whose queues are `queue_type`."""
    code = f"bench-{queue_type}-{uuid.uuid4().hex[:6]}"
    destination = Destination(code=code, broker=BrokerKind.RABBITMQ)
    subs = [Subscription(destination=code, name=n, url="http://127.0.0.1:9/hook")
            for n in SUBSCRIPTIONS]
    publisher = RabbitPublisher(url, queue_type=queue_type)
    await publisher.start()
    try:
        await publisher.ensure_topology(destination, subs)
        body = b"x" * 1024
        started = time.perf_counter()
        for first in range(0, messages, BATCH):
            batch = [Envelope(message_id=uuid7(), destination=code, body=body,
                              biz_id=f"k{i % 100}") for i in range(first, first + BATCH)]
            outcomes = await publisher.publish(destination, batch)
            failed = [o for o in outcomes if not o.ok]
            if failed:
                raise RuntimeError(f"{len(failed)} not confirmed, e.g. {failed[0].error}")
        return messages / (time.perf_counter() - started)
    finally:
        await publisher.close()
        _delete(url, code)


def _delete(url: str, code: str) -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        for name in SUBSCRIPTIONS:
            channel.queue_delete(consumer_name(code, name))
        channel.exchange_delete(topic_name(code))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replication",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args(argv)
    url = services.ensure_rabbitmq().url
    say("warming up")
    asyncio.run(publish_rate(url, "classic", BATCH * 4))
    rows: list[tuple[float, float]] = []
    for run in range(1, args.runs + 1):
        order: list[QueueType] = ["classic", "quorum"] if run % 2 else ["quorum", "classic"]
        rates = {kind: asyncio.run(publish_rate(url, kind, args.messages)) for kind in order}
        classic, quorum = rates["classic"], rates["quorum"]
        rows.append((classic, quorum))
        out(f"run {run}: classic {classic:,.0f} msg/s, quorum {quorum:,.0f} msg/s, "
            f"quorum/classic {quorum / classic:.2f}")

    def spread(values: list[float], fmt: str) -> str:
        return "/".join(format(v, fmt) for v in
                        (min(values), statistics.median(values), max(values)))

    ratios = [q / c for c, q in rows]
    out(f"classic {spread([c for c, _ in rows], ',.0f')} msg/s, quorum "
        f"{spread([q for _, q in rows], ',.0f')} msg/s (min/median/max); quorum/classic "
        f"{spread(ratios, '.2f')}")
    out(json.dumps({"classic_msgs_per_s": [c for c, _ in rows],
                    "quorum_msgs_per_s": [q for _, q in rows],
                    "ratio_quorum_vs_classic_median": statistics.median(ratios)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
