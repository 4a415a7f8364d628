"""msgbus.tasks: a periodic job runs again after its interval, survives its failures, and
with a busy share backs off after slow passes instead of adding to the load that slows them; it
may wait an interval first, be woken, and go again at once while it finds work; its close
cancels a pass under way or gives it a grace to end. A service's close says which step hangs,
and stops a loop even if it lost its cancellation."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus import tasks


class FakeClock:
    """Time that only the job's passes move; the pauses between them are recorded instead."""

    def __init__(self, pass_s: list[float]) -> None:
        self.now = 0.0
        self.pass_s = pass_s
        self.pauses: list[float] = []
        self.passes = 0

    def monotonic(self) -> float:
        return self.now

    async def job(self) -> None:
        self.now += self.pass_s[self.passes]
        self.passes += 1
        if self.passes == 2:
            raise ConnectionError("MongoDB down")

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if len(self.pauses) == len(self.pass_s):
            raise asyncio.CancelledError


def run(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, **options: float) -> None:
    monkeypatch.setattr(tasks, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(tasks, "asyncio", SimpleNamespace(sleep=clock.sleep))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(tasks.periodically(clock.job, 5.0, what="gauges", **options))


def test_a_job_runs_every_interval_and_again_after_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock([0.1, 0.2, 3.0])
    run(monkeypatch, clock)
    assert clock.passes == 3, "the failed second pass did not stop the job"
    assert clock.pauses == [5.0, 5.0, 5.0]


def test_a_slow_pass_makes_the_job_back_off_to_its_busy_share_within_four_intervals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock([0.1, 2.0, 10.0, 0.1])
    run(monkeypatch, clock, max_busy=0.25)
    assert clock.pauses[0] == 5.0
    assert clock.pauses[1] == pytest.approx(6.0), "a 2 s pass is followed by 6 s of rest"
    assert clock.pauses[2] == 20.0, "never more than 4 intervals: the gauge stays fresh"
    assert clock.pauses[3] == 5.0, "back to the interval once passes are quick again"


def test_a_close_that_hangs_says_which_step_and_the_rest_still_close(
        caplog: pytest.LogCaptureFixture) -> None:
    closed: list[str] = []

    async def slow() -> None:
        await asyncio.sleep(0.25)
        closed.append("workers")

    async def quick() -> None:
        closed.append("store")

    asyncio.run(tasks.close_in_order("dispatcher", [("workers", slow), ("store", quick)],
                                     slow_s=0.1))
    assert closed == ["workers", "store"]
    assert "closing the dispatcher: its workers still not closed after 0 s" in caplog.text


def test_a_loop_that_lost_its_cancellation_in_wait_for_still_stops() -> None:
    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        answers: list[asyncio.Future[None]] = []

        async def refresh_loop() -> None:  # like the registry's: a bounded call, then a pause
            while True:
                answers.append(loop.create_future())
                await asyncio.wait_for(answers[-1], 10)
                await asyncio.sleep(0.01)

        task = asyncio.create_task(refresh_loop())
        await eventually_async(lambda: answers, 5, "the loop's first call", interval_s=0)
        answers[-1].set_result(None)  # the call completes just as the close cancels
        task.cancel()
        await asyncio.sleep(0.05)  # a window in which the task must NOT stop (on 3.11)
        still_running = not task.done()
        await asyncio.wait_for(tasks.cancel_and_wait(task, every_s=0.05), 5)
        return still_running, task.cancelled()

    still_running, cancelled = asyncio.run(scenario())
    if sys.version_info < (3, 12):
        assert still_running, "Python 3.11's wait_for drops this cancellation"
    assert cancelled


def test_cancel_and_wait_reraises_a_failure_other_than_the_cancellation() -> None:
    async def scenario() -> None:
        async def fails_on_cancel() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise RuntimeError("cleanup failed") from None

        task = asyncio.create_task(fails_on_cancel())
        await asyncio.sleep(0)  # one loop turn: the task runs into its sleep(10)
        await tasks.cancel_and_wait(task, None)

    with pytest.raises(RuntimeError, match="cleanup failed"):
        asyncio.run(scenario())


def test_a_job_may_wait_an_interval_first_be_woken_and_go_again_at_once_while_busy() -> None:
    async def scenario() -> list[str]:
        passes: list[str] = []
        wake = asyncio.Event()

        async def job() -> bool:  # busy (work found) twice, then idle
            passes.append("pass")
            return len(passes) < 3

        work = tasks.PeriodicWork()
        work.every(60.0, job, what="poll", wake=wake, first_pause=True, again_while_busy=True)
        work.start()
        await asyncio.sleep(0.05)  # a window in which no pass may come: it waits first
        waited_first = list(passes)
        wake.set()
        await eventually_async(lambda: len(passes) == 3, 5, "three passes on one wake",
                               interval_s=0.01)
        await asyncio.sleep(0.05)  # idle now: the next pass waits its interval
        await work.close()
        return [*waited_first, "woken", *passes]

    assert asyncio.run(scenario()) == ["woken", "pass", "pass", "pass"]


def test_a_job_busy_without_awaiting_leaves_the_other_tasks_their_turn() -> None:
    async def scenario() -> int:
        passes = 0

        async def job() -> bool:  # always finds work, never awaits
            nonlocal passes
            passes += 1
            return True

        work = tasks.PeriodicWork()
        work.every(60.0, job, what="busy", again_while_busy=True)
        work.start()
        await asyncio.sleep(0.01)  # the loop must give this task its turn back
        await work.close()
        return passes

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) > 1


@pytest.mark.parametrize("grace_s", [0.0, 5.0])
def test_close_cancels_a_pass_under_way_unless_it_has_a_grace_to_end(grace_s: float) -> None:
    async def scenario() -> list[str]:
        seen: list[str] = []
        work = tasks.PeriodicWork(close_grace_s=grace_s)

        async def job() -> None:
            seen.append("began")
            try:
                await work._closing.wait()  # a long pass that watches the close
                seen.append("ended")
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        work.every(60.0, job, what="long pass")
        work.start()
        await eventually_async(lambda: seen, 5, "the pass begun", interval_s=0.01)
        await asyncio.wait_for(work.close(), 5)
        return seen

    assert asyncio.run(scenario()) == ["began", "ended" if grace_s else "cancelled"]
