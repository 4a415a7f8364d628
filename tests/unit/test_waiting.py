"""The test kit's one polling helper (msgbus_devtools.testkit.waiting)."""

from __future__ import annotations

import itertools

import pytest
from msgbus_devtools.testkit.waiting import NotInTime, Steady, eventually, eventually_async


@pytest.fixture(autouse=True)
def no_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budgets as written (the parallel pass doubles them)."""
    monkeypatch.delenv("MSGBUS_TEST_PATIENCE", raising=False)


def test_eventually_returns_the_first_truthy_value() -> None:
    values = iter([0, None, [], "ready"])
    assert eventually(lambda: next(values), 5, "a value", interval_s=0) == "ready"


def test_a_timeout_says_what_was_awaited_and_how_far_it_got() -> None:
    said = r"timed out after 0.05 s waiting for the thing \(got 3/4\)"
    with pytest.raises(NotInTime, match=said):
        eventually(lambda: False, 0.05, "the thing", interval_s=0.01, progress=lambda: "3/4")


def test_without_what_the_error_quotes_the_condition() -> None:
    items: list[int] = []
    with pytest.raises(NotInTime, match=r"waiting for lambda: len\(items\) == 3"):
        eventually(lambda: len(items) == 3, 0.05, interval_s=0.01)


def test_patience_multiplies_a_budget_unless_the_wait_is_bounded_on_purpose(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGBUS_TEST_PATIENCE", "3")
    with pytest.raises(NotInTime, match=r"timed out after 0\.15 s waiting for the thing"):
        eventually(lambda: False, 0.05, "the thing", interval_s=0.01)
    with pytest.raises(NotInTime, match=r"timed out after 0\.05 s waiting for the thing"):
        eventually(lambda: False, 0.05, "the thing", interval_s=0.01, patient=False)


def test_not_in_time_is_an_assertion_error() -> None:
    assert issubclass(NotInTime, AssertionError)


async def test_eventually_async_awaits_what_the_condition_returns() -> None:
    calls = itertools.count()

    async def found() -> int:
        return next(calls)

    assert await eventually_async(found, 5, "a lookup", interval_s=0) == 1


async def test_eventually_async_times_out_too() -> None:
    with pytest.raises(NotInTime, match="the lookup"):
        await eventually_async(lambda: 0, 0.05, "the lookup", interval_s=0.01)


def test_steady_holds_once_the_value_stopped_changing() -> None:
    values = iter([1, 2, 3, 3, 3, 3, 3, 3])
    steady = Steady(lambda: next(values), quiet_s=0.02)
    assert eventually(steady, 5, "no change", interval_s=0.015)
    assert steady.last == 3
