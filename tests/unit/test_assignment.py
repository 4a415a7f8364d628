"""Which dispatchers serve a subscription (msgbus/assignment.py): every instance computes the
same answer, the load is even, and an instance that comes or goes moves only its share."""

from __future__ import annotations

from collections import Counter

from msgbus.assignment import leavers_holding, serves, serving

SUBS = [f"orders/s{n}" for n in range(1000)]
THREE = ["dispatcher:a", "dispatcher:b", "dispatcher:c"]


def _load(instances: list[str], dispatchers: int) -> Counter[str]:
    return Counter(name for sub in SUBS for name in serving(sub, instances, dispatchers))


def test_each_of_three_instances_hosts_about_two_thirds_with_two_per_subscription() -> None:
    load = _load(THREE, 2)
    assert sum(load.values()) == 2 * len(SUBS)
    assert all(abs(count - 2000 / 3) < 60 for count in load.values()), load
    # the same answer whatever order an instance lists the others in
    assert all(serving(sub, THREE, 2) == serving(sub, list(reversed(THREE)), 2)
               for sub in SUBS[:50])


def test_a_fourth_instance_takes_an_even_share_and_only_that_moves() -> None:
    four = [*THREE, "dispatcher:d"]
    moved = [sub for sub in SUBS if set(serving(sub, THREE, 2)) != set(serving(sub, four, 2))]
    # exactly the subscriptions the newcomer now serves move, one place each
    assert all("dispatcher:d" in serving(sub, four, 2) for sub in moved)
    assert abs(len(moved) - 2 * len(SUBS) / 4) < 60, len(moved)
    # one that dies: only its subscriptions move, to the survivors
    gone = [sub for sub in SUBS if "dispatcher:c" in serving(sub, THREE, 2)]
    for sub in SUBS:
        after = set(serving(sub, ["dispatcher:a", "dispatcher:b"], 2))
        assert after == {"dispatcher:a", "dispatcher:b"}
        if sub not in gone:
            assert set(serving(sub, THREE, 2)) == after


def test_every_instance_serves_when_asked_for_all_or_alone() -> None:
    assert serves("dispatcher:a", "orders/s1", THREE, None)
    assert serves("dispatcher:a", "orders/s1", [], 1)  # sees nobody: it is alone
    assert serves("dispatcher:a", "orders/s1", ["dispatcher:a"], 1)
    assert [serves(name, "orders/s1", THREE, 1) for name in THREE].count(True) == 1


def test_a_newcomer_waits_only_for_the_instances_that_no_longer_serve_a_subscription() -> None:
    four = [*THREE, "dispatcher:d"]
    moved = next(sub for sub in SUBS
                 if set(serving(sub, THREE, 2)) != set(serving(sub, four, 2)))
    leaver = next(name for name in serving(moved, THREE, 2) if name not in serving(moved, four, 2))
    stayer = next(name for name in serving(moved, four, 2) if name != "dispatcher:d")
    hosted = {leaver: {moved}, stayer: {moved}}
    assert leavers_holding(moved, hosted, four, 2) == [leaver]
    assert leavers_holding(moved, {stayer: {moved}}, four, 2) == []  # it let go
    # one that died (not live any more) is not waited for
    assert leavers_holding(moved, hosted, [n for n in four if n != leaver], 2) == []
    assert leavers_holding(moved, hosted, four, None) == []  # served by all: nobody leaves
