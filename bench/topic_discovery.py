"""How soon a subscription that started before its destination's topic existed gets its first
message: a `KafkaSubscriptionConsumer` subscribes to a topic nobody has created yet, the topic
is created (as a receiver does when it first sees the destination) and one message published;
the figure is the time from the publish to the consumer's receive. With the consumer's own
look-up of the missing topic (every `MISSING_TOPIC_LOOK_S`), against librdkafka's refresh alone
(`topic.metadata.refresh.interval.ms`, 10 s), alternating per run on one tansu broker.

    python -m bench.topic_discovery [--runs 3] [--lead-s 2]

`--lead-s`: how long the consumer is subscribed before the topic appears. The figure includes
the consumer group's join, which is tansu's (about 3 s with a 6 s session timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from msgbus_devtools import servers as services
from msgbus_devtools.testkit.waiting import eventually_async

from bench.report import out, say
from msgbus.brokers._kafka_consumer import MISSING_TOPIC_LOOK_S, KafkaSubscriptionConsumer
from msgbus.brokers.kafka import KafkaPublisher
from msgbus.ids import uuid7
from msgbus.models import BrokerKind, Destination, Envelope, Subscription

RECEIVE_TIMEOUT_S = 60.0
MODES = {"looks": MISSING_TOPIC_LOOK_S, "librdkafka": None}


async def first_message_s(bootstrap: str, look_s: float | None, lead_s: float) -> float:
    """Seconds from publishing the first message of a new topic to its receive."""
    code = f"discover-{uuid.uuid4().hex[:8]}"
    destination = Destination(code=code, broker=BrokerKind.KAFKA)
    subscription = Subscription(destination=code, name="s", url="http://127.0.0.1:9/hook")
    consumer = KafkaSubscriptionConsumer(subscription, bootstrap=bootstrap, max_buffered=10,
                                         missing_topic_look_s=look_s)
    publisher = KafkaPublisher(bootstrap)
    await consumer.start()
    await publisher.start()
    try:
        await asyncio.sleep(lead_s)  # subscribed to a topic that does not exist yet
        await publisher.ensure_topology(destination, [subscription])
        published = time.monotonic()
        await publisher.publish(destination, [Envelope(message_id=uuid7(), destination=code,
                                                       body=b"{}")])
        # each look waits up to 0.5 s for a message itself
        await eventually_async(lambda: consumer.receive(1, timeout_s=0.5), RECEIVE_TIMEOUT_S,
                               f"the first message of {code}, published", interval_s=0)
        return time.monotonic() - published
    finally:
        await consumer.close()
        await publisher.close()


async def measure(bootstrap: str, runs: int, lead_s: float) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {mode: [] for mode in MODES}
    for run in range(runs):
        order = list(MODES) if run % 2 == 0 else list(reversed(MODES))
        for mode in order:
            took = await first_message_s(bootstrap, MODES[mode], lead_s)
            figures[mode].append(took)
            say(f"run {run + 1} {mode}: first message {took:.2f} s after it was published")
    return figures


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lead-s", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="msgbus-topic-discovery-") as work:
        tansu = services.start_tansu(services.free_port(), Path(work))
        try:
            figures = asyncio.run(measure(tansu.url, args.runs, args.lead_s))
        finally:
            tansu.stop()
    ratios = [b / a for a, b in zip(figures["looks"], figures["librdkafka"], strict=True)]
    out("seconds from the first publish to its receive, min / median / max")
    rows = [(f"consumer looks every {MISSING_TOPIC_LOOK_S:.0f} s", figures["looks"]),
            ("librdkafka's refresh alone", figures["librdkafka"]),
            ("ratio (librdkafka / looks)", ratios)]
    for label, values in rows:
        out(f"  {label:<30} {spread(values)}")
    out(json.dumps({"bench": "topic_discovery", "runs": args.runs, "lead_s": args.lead_s,
                    **{f"{mode}_s": values for mode, values in figures.items()},
                    "ratio_median": statistics.median(ratios)}))


if __name__ == "__main__":
    main()
