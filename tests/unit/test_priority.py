"""Priority (controller/priority.py): the pure rules as tables, then the controller's two lines
driven on the fake effects with the tests' clock (time moves only when a test moves it): a
``max_concurrent`` line where a high caller's next request gets the next slot past 50 low ones,
equal priorities served in exact arrival order, a low waiter served within the aging bound under
a steady stream of high ones, and the memory queue's head chosen by priority."""

from __future__ import annotations

import asyncio

import pytest
from unit.fake_effects import Steps, steps
from unit.ondemand_harness import until

from dgxmm.controller import priority
from dgxmm.controller.slots import Slot
from dgxmm.records.deployment import State

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("prio", "waited_s", "aging_s", "expected"),
    [
        (5, 0.0, 10.0, 5),
        (5, 9.99, 10.0, 5),
        (5, 10.0, 10.0, 6),
        (0, 25.0, 10.0, 2),
        (-3, 30.0, 10.0, 0),
        (3, 1000.0, 0.0, 3),  # aging off
        (0, -1.0, 10.0, 0),  # a clock read before the arrival ages nobody
    ],
)
def test_effective(prio: int, waited_s: float, aging_s: float, expected: int) -> None:
    assert priority.effective(prio, waited_s, aging_s) == expected


@pytest.mark.parametrize(
    ("waiters", "now", "expected"),
    [
        ([(0, 0.0), (0, 3.0), (0, 35.0)], 40.0, [0, 1, 2]),  # equal: arrival order, aged or not
        ([(7, 0.0), (7, 9.0), (7, 11.0)], 200.0, [0, 1, 2]),
        ([(0, 0.0), (10, 5.0), (0, 1.0)], 5.0, [1, 0, 2]),  # the high one first
        ([(0, 0.0), (10, 99.0)], 99.9, [1, 0]),  # the low one aged to 9: still behind
        ([(0, 0.0), (10, 100.0)], 100.0, [0, 1]),  # aged to 10: a tie, arrival decides
        ([(0, 0.0), (10, 100.0)], 110.0, [0, 1]),  # both aged one more: a tie still
        ([(0, 0.0), (10, 90.0)], 110.0, [1, 0]),  # one that came within (10 + 1) * 10 s after it
        ([(0, 0.0), (10, 115.0)], 115.0, [0, 1]),  # one that came later is behind it
    ],
)
def test_line(waiters: list[tuple[int, float]], now: float, expected: list[int]) -> None:
    assert priority.line(waiters, now, 10.0) == expected


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([(0, 0.0, False), (0, 1.0, False), (0, 2.0, False)], [0, 1, 2]),  # equal: order of joining
        ([(0, 0.0, False), (5, 1.0, False), (2, 2.0, False)], [1, 2, 0]),
        ([(0, 0.0, True), (5, 1.0, False)], [0, 1]),  # making room: not overtaken
        ([(5, 0.0, False), (0, 1.0, True)], [1, 0]),
        ([(0, 0.0, False), (2, 15.0, False)], [0, 1]),  # aged from joining: 0 + 2 against 2 + 0, a tie
        ([(0, 0.0, False), (3, 15.0, False)], [1, 0]),  # 2 against 3
    ],
)
def test_queue_order(entries: list[tuple[int, float, bool]], expected: list[int]) -> None:
    assert priority.queue_order(entries, 20.0, 10.0) == expected


def limited(s: Steps) -> None:
    s.fx.add("a", 4, State.READY)
    s.fx.update("a", max_concurrent=1)


async def waits(s: Steps, prio: int, name: str) -> asyncio.Task[Slot]:
    """A request of priority ``prio`` that finds no free slot, in line once this returns."""
    count = s.controller.total_waiting
    task = asyncio.create_task(s.controller.acquire("a", request_id=name, priority=prio))
    await until(lambda: s.controller.total_waiting == count + 1)
    return task


async def served(s: Steps, slot: Slot, tasks: dict[str, asyncio.Task[Slot]]) -> tuple[str, Slot]:
    """Release ``slot``: the name of the waiter handed the next one, and that slot."""
    slot.release()
    await until(lambda: any(task.done() for task in tasks.values()))
    name = next(name for name, task in tasks.items() if task.done())
    return name, await tasks.pop(name)


async def test_a_high_callers_next_request_gets_the_next_slot_past_fifty_low_ones() -> None:
    async with steps() as s:
        limited(s)
        slot = await s.controller.acquire("a")
        tasks = {f"low{n}": await waits(s, 0, f"low{n}") for n in range(50)}
        tasks["high"] = await waits(s, 10, "high")
        rows = {r["request_id"]: (r["priority"], r["place"]) for r in s.controller.waiting("a")}
        assert rows["high"] == (10, 1) and rows["low0"] == (0, 2) and rows["low49"] == (0, 51)
        name, slot = await served(s, slot, tasks)
        assert name == "high"
        order = []
        while tasks:
            name, slot = await served(s, slot, tasks)
            order.append(name)
        assert order == [f"low{n}" for n in range(50)]
        slot.release()


async def test_equal_priorities_are_served_in_exact_arrival_order() -> None:
    """Arrivals spread over several aging periods, at priority 3: arrival order, exactly."""
    async with steps(priority_aging_s=10) as s:
        limited(s)
        slot = await s.controller.acquire("a")
        tasks = {}
        for n in range(20):
            tasks[f"r{n}"] = await waits(s, 3, f"r{n}")
            s.clock.advance(7)
        order = []
        while tasks:
            name, slot = await served(s, slot, tasks)
            order.append(name)
            s.clock.advance(3)
        assert order == [f"r{n}" for n in range(20)]
        slot.release()


async def test_a_low_waiter_is_served_within_the_aging_bound_under_a_steady_high_stream() -> None:
    """A high request (10) arrives every second and a slot is released every second; the low one
    (0) waits 10 aging periods of 10 s, then ties with the newest high one and goes first by
    arrival: served at 100 s, inside the bound (10 - 0 + 1) * 10 s."""
    async with steps(priority_aging_s=10) as s:
        limited(s)
        slot = await s.controller.acquire("a")
        tasks = {"low": await waits(s, 0, "low")}
        for second in range(1, 200):
            s.clock.advance(1)
            tasks[f"high{second}"] = await waits(s, 10, f"high{second}")
            name, slot = await served(s, slot, tasks)
            if name == "low":
                break
            assert name == f"high{second}"
        assert second == 100
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        slot.release()


async def test_the_memory_queue_starts_the_model_of_the_highest_priority_first() -> None:
    async with steps(priority_aging_s=10) as s:
        s.fx.add("busy", 8, State.READY)
        held = await s.controller.acquire("busy")
        s.fx.add("x", 6)
        s.fx.add("y", 6)
        x = asyncio.create_task(s.controller.acquire("x", priority=0))
        await until(lambda: s.controller.queue_ids() == ["x"])
        y = asyncio.create_task(s.controller.acquire("y", priority=0))
        await until(lambda: s.controller.queue_ids() == ["x", "y"])
        y_high = asyncio.create_task(s.controller.acquire("y", priority=5))  # y's best waiter: 5
        await until(lambda: s.controller.queue_ids() == ["y", "x"])
        held.release()
        s.clock.advance(120)  # busy idle past its timeout: the head y makes room and starts
        await until(lambda: ("restart", "y") in s.fx.calls)
        assert ("restart", "x") not in s.fx.calls
        for task in (x, y, y_high):
            task.cancel()
        await asyncio.gather(x, y, y_high, return_exceptions=True)


async def test_a_higher_waiter_of_a_queued_model_makes_it_the_head_at_once() -> None:
    """y overtakes x in the memory queue when a request of priority 5 joins its waiters; that
    request's own look sees y the head and times its next one as the head's (its drain is due
    30 s after y joined), not at ``waiter_wake_s`` (1000 s): y drains the busy model and starts
    at 31 s, x stays queued."""
    async with steps(max_drain_wait_s=30, waiter_wake_s=1000) as s:
        s.fx.add("busy", 8, State.READY)
        held = await s.controller.acquire("busy")
        s.fx.add("x", 6)
        s.fx.add("y", 6)
        x = asyncio.create_task(s.controller.acquire("x"))
        await until(lambda: s.controller.queue_ids() == ["x"])
        y = asyncio.create_task(s.controller.acquire("y"))
        await until(lambda: s.controller.queue_ids() == ["x", "y"])
        y_high = asyncio.create_task(s.controller.acquire("y", priority=5))
        await until(lambda: s.controller.queue_ids() == ["y", "x"] and s.controller.total_waiting == 3)
        for _ in range(50):  # every waiter looked again and waits on its timer
            await asyncio.sleep(0)
        s.clock.advance(31)
        await until(
            lambda: s.controller.tracked("busy") is not None and s.controller.tracked("busy").drained_for == "y"
        )
        held.release()
        await until(lambda: ("restart", "y") in s.fx.calls)
        assert ("restart", "x") not in s.fx.calls
        for task in (x, y, y_high):
            task.cancel()
        await asyncio.gather(x, y, y_high, return_exceptions=True)
