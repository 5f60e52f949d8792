"""The controller asks for a prefetch of a model's files exactly while its start waits for room
(issue 40): from its join of the memory queue to its start, or to the wait given up (the caller
hung up, the queue timeout), and never for a start that begins at once. On a fake ``Effects``:
no I/O, no sleeps, each interleaving driven."""

from __future__ import annotations

import asyncio

import pytest
from unit.fake_effects import steps
from unit.ondemand_harness import until

from dgxmm.controller.errors import QueueTimeout
from dgxmm.records.deployment import State

pytestmark = pytest.mark.timeout(15)


async def test_a_start_that_fits_at_once_prefetches_nothing() -> None:
    async with steps() as s:
        s.fx.add("a", 4)
        task = asyncio.create_task(s.controller.acquire("a"))
        await until(lambda: s.fx.calls == [("restart", "a")])
        s.fx.ready("a")
        (await task).release()
        assert s.fx.prefetches == []


async def test_a_make_room_wait_prefetches_until_the_start_begins() -> None:
    """The prefetch is asked for when x queues behind the victim's stop, and ended in the plain
    step that starts x (the deployer spawns the engine as its own task, after that step: the
    engine's read never competes with the prefetch's, and the start never waits for it)."""
    async with steps() as s:
        s.fx.add("old", 6, State.READY)
        s.clock.advance(61)
        s.fx.add("x", 6)
        s.fx.hold_stops = True
        task = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.fx.calls == [("stop", "old", "Stopped to make room for x")])
        assert s.fx.prefetches == [("want", "x")]  # while the victim stops
        s.fx.finish_stop("old")
        await until(lambda: s.fx.calls[-1] == ("restart", "x"))
        assert s.fx.prefetches == [("want", "x"), ("done", "x")]  # (seen in the same loop pass)
        s.fx.ready("x")
        (await task).release()
        assert s.fx.prefetches == [("want", "x"), ("done", "x")]


async def test_a_caller_that_hangs_up_ends_the_prefetch() -> None:
    async with steps(queue_timeout_s=100) as s:
        s.fx.add("busy", 8, State.READY)
        slot = await s.controller.acquire("busy")
        s.fx.add("x", 6)
        task = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.fx.prefetches == [("want", "x")])
        task.cancel()
        await until(lambda: s.fx.prefetches == [("want", "x"), ("done", "x")])
        assert s.controller.queue_ids() == []
        slot.release()


async def test_the_queue_timeout_ends_the_prefetch() -> None:
    async with steps(queue_timeout_s=100, waiter_wake_s=1000) as s:
        s.fx.add("busy", 8, State.READY)
        slot = await s.controller.acquire("busy")
        s.fx.add("x", 6)
        task = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.fx.prefetches == [("want", "x")])
        s.clock.advance(100)
        with pytest.raises(QueueTimeout):
            await task
        assert s.fx.prefetches == [("want", "x"), ("done", "x")]
        slot.release()


async def test_two_waiting_models_are_asked_for_in_queue_order_once_each() -> None:
    async with steps(queue_timeout_s=100) as s:
        s.fx.add("busy", 8, State.READY)
        slot = await s.controller.acquire("busy")
        s.fx.add("x", 6)
        s.fx.add("y", 6)
        tasks = [asyncio.create_task(s.controller.acquire(name)) for name in ("x", "y", "x", "y")]
        await until(lambda: s.controller.queue_ids() == ["x", "y"])
        assert s.fx.prefetches == [("want", "x"), ("want", "y")]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await until(lambda: s.controller.queue_ids() == [])
        assert sorted(s.fx.prefetches[2:]) == [("done", "x"), ("done", "y")]
        slot.release()
