"""Which dispatcher instances serve a subscription: `dispatchers` of them (a subscription setting;
None: all), chosen among the live ones by rendezvous hashing (highest random weight).

Every instance computes the same answer from the same inputs (the subscription's id and the
live instances' names, which every instance reads from the heartbeats in MongoDB), so no leader
and no stored assignment is needed. When an instance joins or leaves, only the subscriptions
it gains or held move (about dispatchers / instances of them), and each instance hosts about
dispatchers / instances of all subscriptions (Hermes balances consumers over nodes the same
way, through ZooKeeper).

A subscription that moves starts on its new instance once the instances that no longer serve
it have let it go (`leavers_holding`): one Kafka group rebalance after the other, never a member
leaving while another joins.

While two instances' views of who is alive differ (for at most a heartbeat), a subscription may
be served by one instance more or less than asked: messages wait in the broker, and the cap's
shares split over whoever serves it (msgbus/delivery/shares.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping


def _weight(sub_id: str, instance: str) -> int:
    digest = hashlib.blake2b(f"{sub_id}\x00{instance}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def serving(sub_id: str, instances: Iterable[str], dispatchers: int | None) -> list[str]:
    """The instances that serve `sub_id`, best first: the `dispatchers` with the highest
    weight (all when None or at least as many as there are)."""
    ranked = sorted(instances, key=lambda instance: _weight(sub_id, instance), reverse=True)
    return ranked if dispatchers is None else ranked[:dispatchers]


def serves(instance: str, sub_id: str, instances: Iterable[str],
           dispatchers: int | None) -> bool:
    """Whether `instance` is among those that serve `sub_id` (an instance that sees nobody,
    not even itself, serves everything: it is alone)."""
    live = set(instances)
    if dispatchers is None or not live:
        return True
    live.add(instance)
    return instance in serving(sub_id, live, dispatchers)


def leavers_holding(sub_id: str, hosted: Mapping[str, Iterable[str]], instances: Iterable[str],
                    dispatchers: int | None) -> list[str]:
    """The live instances that still serve `sub_id` (by `hosted`: what each says it serves)
    although the assignment no longer gives it to them: a newcomer waits for them to let go."""
    live = set(instances)
    return sorted(name for name, subs in hosted.items()
                  if sub_id in subs and name in live
                  and not serves(name, sub_id, live, dispatchers))
