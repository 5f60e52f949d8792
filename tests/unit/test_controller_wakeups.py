"""Targeted wake-ups (docs/controller.md, "Who wakes for what"): a change wakes the waiters it
concerns and nobody else. Each check reads, synchronously after the change, whether the event a
deployment's waiters wait on was set: no sleeps, no loop ticks before an assert. The last two
drive what these wake-ups are for on the real deployer, end to end (the clock never moves, so a
waiter's timer never ends a wait): the queued model starts once another's memory is freed, and
once the head before it gives up. (Other changes in those runs wake the queue too, so the two
mutants that drop one of these wake-ups are killed by the first two tests, not by these.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from unit.fake_effects import Steps, steps
from unit.ondemand_harness import harness, until

from dgxmm.records.deployment import State

pytestmark = pytest.mark.timeout(15)


async def waiting(s: Steps) -> tuple[asyncio.Task, asyncio.Task]:
    """x is starting (one waiter); q is queued for memory behind nothing (one waiter): y, ready
    and not idle yet, holds what q needs."""
    s.fx.add("x", 4, State.STARTING)
    s.fx.add("y", 4, State.READY)
    s.fx.add("q", 8)
    x = asyncio.create_task(s.controller.acquire("x"))
    q = asyncio.create_task(s.controller.acquire("q"))
    await until(lambda: s.controller.queue_ids() == ["q"] and s.controller.total_waiting == 2)
    await until(lambda: all(t.done() for t in s.controller.state.attempts.values()))
    return x, q


async def test_another_models_change_wakes_the_queue_but_not_a_starting_models_waiters() -> None:
    async with steps(capacity=10) as s:
        x, q = await waiting(s)
        of_x, of_q = s.controller.state.wakeup("x"), s.controller.state.wakeup("q")
        s.fx.set_state("y", State.ASLEEP)  # a change of y: what q decides on, nothing of x
        assert of_q.is_set() and not of_x.is_set()
        of_x = s.controller.state.wakeup("x")
        s.fx.ready("x")  # x's own change wakes its waiters
        assert of_x.is_set()
        (await x).release()
        q.cancel()
        await asyncio.gather(q, return_exceptions=True)


async def test_a_queue_join_wakes_only_its_own_waiters() -> None:
    async with steps(capacity=10) as s:
        x, q = await waiting(s)
        s.fx.add("r", 8)
        of_x, of_q, of_r = (s.controller.state.wakeup(i) for i in ("x", "q", "r"))
        s.controller.state.enqueue("r")  # behind q: neither the head nor its reservation changed
        assert of_r.is_set() and not of_q.is_set() and not of_x.is_set()
        of_r = s.controller.state.wakeup("r")
        s.controller.state.leave_queue("q")  # the head leaves: the next entry is the head now
        assert of_r.is_set() and not of_x.is_set()
        for task in (x, q):
            task.cancel()
        await asyncio.gather(x, q, return_exceptions=True)


async def test_memory_freed_by_another_models_stop_starts_the_queued_model(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await h.add("busy", 6, state=State.READY)
        slot = await h.controller.acquire("busy")  # in flight: never a victim
        await h.add("b", 6)
        task = asyncio.create_task(h.controller.acquire("b"))
        await until(lambda: h.controller.queue_ids() == ["b"])
        await h.quiet()
        await h.deployer.stop("busy", actor="test")  # by hand: its memory is free, b's waiter is woken
        await h.deployer.starting("b")
        h.deployer.finish_start("b")
        (await task).release()
        slot.release()


async def test_the_head_leaving_lets_the_next_entry_make_room(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await h.add("busy", 4, state=State.READY)
        slot = await h.controller.acquire("busy")
        await h.add("v", 2, state=State.READY)
        h.idle_for(61)  # v is idle: a victim for whoever is the head
        await h.add("a", 8)  # 4 free and v's 2 do not cover it: queued, stopping nobody
        await h.add("b", 5)  # behind a: only the head makes room
        first = asyncio.create_task(h.controller.acquire("a"))
        await until(lambda: h.controller.queue_ids() == ["a"])
        second = asyncio.create_task(h.controller.acquire("b"))
        await until(lambda: h.controller.queue_ids() == ["a", "b"])
        await h.quiet()
        assert h.state("v") is State.READY
        first.cancel()  # the head gives up: b is the head now, and v's stop covers it
        await asyncio.gather(first, return_exceptions=True)
        await h.deployer.starting("b")
        assert h.state("v") is State.STOPPED
        h.deployer.finish_start("b")
        (await second).release()
        slot.release()
