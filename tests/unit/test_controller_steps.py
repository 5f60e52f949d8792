"""The controller's steps on a fake ``Effects``: which effects it asks for, in which order, with no
I/O and no sleeps (loop ticks only). What the real deployer does with them is tested elsewhere."""

from __future__ import annotations

import asyncio

import pytest
from unit.fake_effects import steps
from unit.ondemand_harness import until

from dgxmm.records.deployment import Mode, State
from dgxmm.controller.errors import DoesNotFit, QueueTimeout

pytestmark = pytest.mark.timeout(15)

ROOM_FOR_X = "Stopped to make room for x"


async def test_a_burst_asks_for_one_restart() -> None:
    async with steps() as s:
        s.fx.add("a", 4)
        tasks = [asyncio.create_task(s.controller.acquire("a")) for _ in range(100)]
        await until(lambda: s.fx.calls == [("restart", "a")])
        s.fx.ready("a")
        for slot in await asyncio.gather(*tasks):
            slot.release()
        assert s.fx.calls == [("restart", "a")]
        assert s.recorder.audits == ["ondemand_start"]


async def test_asleep_asks_for_a_wake() -> None:
    async with steps() as s:
        s.fx.add("a", 4, State.ASLEEP)
        task = asyncio.create_task(s.controller.acquire("a"))
        await until(lambda: s.fx.calls == [("wake", "a")])
        s.fx.ready("a")
        (await task).release()


async def test_make_room_stops_then_starts_and_decides_again_between() -> None:
    """x needs one victim: the stop (with the controller's precheck) is asked for; while it runs
    nothing else is decided for x; once done, x is started from a fresh decision."""
    async with steps() as s:
        s.fx.add("old", 3, State.READY)
        s.clock.advance(1)
        s.fx.add("new", 3, State.READY)
        s.clock.advance(61)
        s.fx.add("x", 6)
        s.fx.hold_stops = True
        task = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.fx.calls == [("stop", "old", ROOM_FOR_X)])
        assert s.controller.queue_ids() == ["x"]
        s.fx.finish_stop("old")
        await until(lambda: s.fx.calls[-1] == ("restart", "x"))
        assert s.fx.calls == [("stop", "old", ROOM_FOR_X), ("restart", "x")]
        assert s.controller.queue_ids() == []
        s.fx.ready("x")
        (await task).release()
        assert s.recorder.audits == ["ondemand_sleep", "ondemand_start"]


async def test_a_refused_precheck_reserves_nothing_and_the_head_stays_queued() -> None:
    """Between the pick and the precheck v's engine reports a running request: the precheck
    refuses, nothing is reserved for x, and x stays queued."""
    async with steps() as s:
        s.fx.add("v", 6, State.READY)
        s.clock.advance(61)
        s.fx.add("x", 6)
        s.fx.before_precheck = s.samples.busy.add
        task = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: ("refused", "v") in s.fx.calls)
        await until(lambda: all(t.done() for t in s.controller.state.attempts.values()))
        assert s.controller.state.queue.victims_of_head("other") == {}
        assert s.controller.queue_ids() == ["x"] and s.fx.deps["v"].state is State.READY
        assert s.recorder.audits == []
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_start_refused_by_a_fresher_budget_reading_queues() -> None:
    """A measured budget may read less free memory at the start's own fit check than in the
    snapshot a moment before: the start is refused, x is queued, and starts on the next change."""
    async with steps() as s:
        s.fx.add("x", 6)

        def shrink(deployment_id: str) -> None:
            s.fx.before_start = None
            s.fx.capacity = 5

        s.fx.before_start = shrink
        task = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.controller.queue_ids() == ["x"])
        assert s.fx.calls == [] and s.fx.deps["x"].state is State.STOPPED
        s.fx.capacity = 10
        s.fx.add("other", 1)  # any change wakes the waiter, which decides again
        await until(lambda: s.fx.calls == [("restart", "x")])
        s.fx.ready("x")
        (await task).release()


async def test_does_not_fit_asks_for_nothing() -> None:
    async with steps() as s:
        s.fx.add("fixed", 4, State.READY, Mode.ALWAYS_ON)
        s.fx.add("huge", 7)
        with pytest.raises(DoesNotFit):
            await s.controller.acquire("huge")
        assert s.fx.calls == []


async def test_behind_a_blocked_head_only_what_fits_beside_it_starts() -> None:
    async with steps() as s:
        s.fx.add("busy", 6, State.READY)
        slot = await s.controller.acquire("busy")
        s.fx.add("x", 6)
        s.fx.add("y", 5)
        s.fx.add("z", 4)
        x = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.controller.queue_ids() == ["x"])
        y = asyncio.create_task(s.controller.acquire("y"))
        await until(lambda: s.controller.queue_ids() == ["x", "y"])
        z = asyncio.create_task(s.controller.acquire("z"))
        await until(lambda: s.fx.calls == [("restart", "z")])
        s.fx.ready("z")
        (await z).release()
        assert s.controller.queue_ids() == ["x", "y"]
        for task in (x, y):
            task.cancel()
        await asyncio.gather(x, y, return_exceptions=True)
        slot.release()


async def test_the_deadline_fires_on_the_clock_alone() -> None:
    """Nothing changes while x waits: only its timer, at its deadline, ends the wait."""
    async with steps(queue_timeout_s=100, waiter_wake_s=1000) as s:
        s.fx.add("busy", 8, State.READY)
        slot = await s.controller.acquire("busy")
        s.fx.add("x", 6)
        task = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.controller.queue_ids() == ["x"])
        s.clock.advance(99)
        for _ in range(50):
            await asyncio.sleep(0)
        assert not task.done()
        s.clock.advance(1)
        with pytest.raises(QueueTimeout):
            await task
        assert s.recorder.audits == ["ondemand_queue_timeout"]
        slot.release()


async def test_waiters_are_released_the_moment_the_model_turns_ready() -> None:
    """Issue 14: no wake-up interval between ready and the grant. The fake clock never moves and
    waiters would look again only after 1000 s; the change to ready alone grants every waiter
    within a few passes of the event loop."""
    async with steps(waiter_wake_s=1000) as s:
        s.fx.add("a", 4)
        tasks = [asyncio.create_task(s.controller.acquire("a")) for _ in range(10)]
        await until(lambda: s.fx.calls == [("restart", "a")])
        for _ in range(20):
            await asyncio.sleep(0)
        assert not any(task.done() for task in tasks)
        s.fx.ready("a")
        for _ in range(5):
            await asyncio.sleep(0)
        assert all(task.done() for task in tasks)
        for task in tasks:
            task.result().release()


async def test_a_victims_sample_turning_idle_wakes_the_queue() -> None:
    """Make-room needs a victim's fresh idle sample besides no slot in flight: when its last
    request ends while its engine still reports a request running, the queued start looks
    again the moment a sample shows it idle, not at its next ``waiter_wake_s`` (1000 s here)."""
    async with steps(evict_idle_s=0, waiter_wake_s=1000, queue_timeout_s=2000) as s:
        s.fx.add("a", 8, State.READY)
        s.samples.busy.add("a")
        slot = await s.controller.acquire("a")
        s.fx.add("x", 6)
        task = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.controller.queue_ids() == ["x"])
        slot.release()
        for _ in range(50):
            await asyncio.sleep(0)
        assert s.fx.calls == []  # its engine still says busy
        s.samples.turned_idle("a")
        await until(lambda: s.fx.calls == [("stop", "a", ROOM_FOR_X)])
        await until(lambda: s.fx.calls[-1] == ("restart", "x"))
        s.fx.ready("x")
        (await task).release()
