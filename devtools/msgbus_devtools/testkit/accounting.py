"""Accounting of a load's messages at the subscribers: for every subscription, each message whose
send() returned is delivered (answered 2xx at least once), or lost; every 2xx push beyond the
first of a message is a duplicate. Pushes the subscriber refused (5xx while it was failing)
count neither as deliveries nor as duplicates: they are the bus retrying.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from msgbus_devtools.testkit.subscriber import RecordingSubscriber


@dataclass
class SubscriptionAccount:
    subscription: str
    expected: int  # messages whose send() returned, to this subscription's destination
    delivered: int  # of those, pushed and answered 2xx at least once
    duplicates: int  # 2xx pushes beyond the first, of expected messages
    refused_pushes: int  # pushes the subscriber answered with a non-2xx status
    unexpected: int  # distinct messages pushed that no returned send() made
    lost_ids: set[str] = field(default_factory=set)
    duplicate_times: list[float] = field(default_factory=list)  # monotonic, of each duplicate
    recorded_delivered: int | None = None  # marked delivered in MongoDB, when checked

    @property
    def lost(self) -> int:
        return len(self.lost_ids)


def account(subscription: str, expected: set[str],
            subscriber: RecordingSubscriber) -> SubscriptionAccount:
    successes = subscriber.successes()
    pushes = list(subscriber.pushes)
    delivered = expected & successes.keys()
    seen: set[str] = set()
    duplicate_times = []
    for push in pushes:
        if push.succeeded and push.message_id in expected:
            if push.message_id in seen:
                duplicate_times.append(push.at)
            seen.add(push.message_id)
    return SubscriptionAccount(
        subscription=subscription,
        expected=len(expected),
        delivered=len(delivered),
        duplicates=sum(successes[m] - 1 for m in delivered),
        refused_pushes=sum(1 for p in pushes if not p.succeeded),
        unexpected=len({p.message_id for p in pushes} - expected),
        lost_ids=expected - delivered,
        duplicate_times=duplicate_times,
    )


@dataclass
class Totals:
    sent: int  # send()s that returned
    expected: int  # message x subscription pairs
    delivered: int
    duplicates: int
    lost: int  # pairs
    lost_messages: int  # messages missing at one subscriber or more

    @property
    def duplicate_rate(self) -> float:
        """Duplicate pushes per expected delivery (message x subscription)."""
        return self.duplicates / self.expected if self.expected else 0.0

    def as_json(self) -> dict[str, Any]:
        return {"sent": self.sent, "expected_deliveries": self.expected,
                "delivered": self.delivered, "duplicates": self.duplicates,
                "duplicate_rate": round(self.duplicate_rate, 5), "lost": self.lost,
                "lost_messages": self.lost_messages}


def totals(sent: int, accounts: list[SubscriptionAccount]) -> Totals:
    lost_messages: set[str] = set()
    for acc in accounts:
        lost_messages |= acc.lost_ids
    return Totals(sent=sent, expected=sum(a.expected for a in accounts),
                  delivered=sum(a.delivered for a in accounts),
                  duplicates=sum(a.duplicates for a in accounts),
                  lost=sum(a.lost for a in accounts), lost_messages=len(lost_messages))


def table(accounts: list[SubscriptionAccount], total: Totals,
          brokers: Mapping[str, str]) -> str:
    """The accounting as a text table, one row per subscription and a total row."""
    head = ("subscription", "broker", "sent", "delivered", "dupl.", "dupl. %", "lost",
            "refused", "in MongoDB")
    rows = []
    for acc in accounts:
        rate = acc.duplicates / acc.expected if acc.expected else 0.0
        recorded = "-" if acc.recorded_delivered is None else str(acc.recorded_delivered)
        rows.append((acc.subscription, brokers.get(acc.subscription.split("/", 1)[0], "?"),
                     str(acc.expected), str(acc.delivered), str(acc.duplicates),
                     f"{rate * 100:.2f}", str(acc.lost), str(acc.refused_pushes), recorded))
    recorded_all = [a.recorded_delivered for a in accounts]
    rows.append(("all", "", str(total.expected), str(total.delivered), str(total.duplicates),
                 f"{total.duplicate_rate * 100:.2f}", str(total.lost),
                 str(sum(a.refused_pushes for a in accounts)),
                 "-" if None in recorded_all else str(sum(r or 0 for r in recorded_all))))
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(row, widths, strict=True)))

    rule = "  ".join("-" * w for w in widths)
    body = [line(head), rule, *map(line, rows[:-1]), rule, line(rows[-1])]
    return (f"accounting of {total.sent} messages whose send() returned, at every subscriber "
            f"(\"sent\" per row: messages x that subscription):\n" + "\n".join(body))
