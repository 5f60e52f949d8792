"""Turns under a deployment's ``max_concurrent`` (controller/turns.py, ``Controller._hand_out``)
and an administrator's cancel of a waiting request, driven step by step on the fake effects:
every interleaving the rules name is made to happen (a release while a newcomer arrives, a
hang-up before and after the slot was handed over), with loop ticks only, no sleeps."""

from __future__ import annotations

import asyncio

import pytest
from unit.fake_effects import Steps, steps
from unit.ondemand_harness import until

from dgxmm.controller.errors import Cancelled, QueueFull, QueueTimeout, ShuttingDown
from dgxmm.controller.slots import Slot
from dgxmm.records.deployment import Mode, State

pytestmark = pytest.mark.timeout(15)


def limited(s: Steps, limit: int, mode: Mode = Mode.ON_DEMAND) -> None:
    s.fx.add("a", 4, State.READY, mode=mode)
    s.fx.update("a", max_concurrent=limit)


async def line(s: Steps, count: int) -> list[asyncio.Task[Slot]]:
    """``count`` requests that find no free slot, each in line after the one before."""
    tasks = []
    for n in range(count):
        tasks.append(asyncio.create_task(s.controller.acquire("a", request_id=f"r{n}")))
        await until(lambda n=n: s.controller.total_waiting == n + 1)
    await until(lambda: all(w.woken.is_set() is False for w in s.controller.state.waiters["a"]))
    return tasks


async def test_at_most_max_concurrent_run_and_the_rest_are_served_in_arrival_order() -> None:
    async with steps() as s:
        limited(s, 2)
        first, second = await s.controller.acquire("a"), await s.controller.acquire("a")
        waiting = await line(s, 3)
        assert s.controller.status("a") | {"last_request_at": None} == {
            "inflight": 2,
            "queued": 3,
            "last_request_at": None,
            "phase": "serving",
        }
        first.release()  # the slot goes to the longest waiter, in the release itself
        assert s.controller.status("a")["inflight"] == 2 and s.controller.total_waiting == 2
        got = await waiting[0]
        assert not waiting[1].done() and not waiting[2].done()
        second.release()
        await waiting[1]
        got.release()
        (await waiting[2]).release()
        (await waiting[1]).release()
        assert s.controller.status("a")["inflight"] == 0 and s.controller.total_waiting == 0


async def test_a_slot_released_while_a_newcomer_arrives_goes_to_the_waiter() -> None:
    """The release and the newcomer in one step, before the waiter runs again: the newcomer
    finds the slot handed over already and takes its place at the end of the line."""
    async with steps() as s:
        limited(s, 1)
        held = await s.controller.acquire("a")
        [waiter] = await line(s, 1)
        held.release()
        assert s.controller.try_slot("a") is None  # the newcomer, at that very moment
        newcomer = asyncio.create_task(s.controller.acquire("a"))
        mine = await waiter
        assert not mine.cold, "it waited for its turn, not for a start"
        await until(lambda: s.controller.total_waiting == 1)
        assert not newcomer.done() and s.controller.status("a")["inflight"] == 1
        mine.release()
        (await newcomer).release()


async def test_no_barging_while_one_waits_and_a_slot_is_free() -> None:
    """A limit raised while one waits: the slot is the waiter's, not a newcomer's."""
    async with steps() as s:
        limited(s, 1)
        held = await s.controller.acquire("a")
        [waiter] = await line(s, 1)
        s.fx.update("a", max_concurrent=3)  # room for two more; the waiter's wake-up is set
        assert s.controller.try_slot("a") is None, "one waits before it"
        first = await waiter
        assert s.controller.try_slot("a") is not None  # now nobody waits: at once
        first.release()
        held.release()


async def test_a_hang_up_while_waiting_leaves_the_line() -> None:
    async with steps() as s:
        limited(s, 1)
        held = await s.controller.acquire("a")
        gone, stays = await line(s, 2)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert [row["request_id"] for row in s.controller.waiting("a")] == ["r1"]
        assert s.controller.status("a")["queued"] == 1
        held.release()
        (await stays).release()
        assert s.controller.status("a")["inflight"] == 0


async def test_a_hang_up_after_the_slot_was_handed_over_passes_it_on() -> None:
    """The release hands the slot to the first waiter; it hangs up before it runs again: its
    slot goes to the next in line, none is leaked."""
    async with steps() as s:
        limited(s, 1)
        held = await s.controller.acquire("a")
        first, second = await line(s, 2)
        held.release()
        first.cancel()  # handed the slot, not resumed yet
        results = await asyncio.gather(first, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        slot = await second
        assert s.controller.status("a")["inflight"] == 1
        slot.release()
        assert s.controller.status("a")["inflight"] == 0 and s.controller.total_waiting == 0


async def test_the_queue_timeout_applies_to_a_turn() -> None:
    async with steps(queue_timeout_s=30) as s:
        limited(s, 1)
        held = await s.controller.acquire("a")
        [waiter] = await line(s, 1)
        s.clock.advance(30)
        with pytest.raises(QueueTimeout):
            await waiter
        assert s.controller.total_waiting == 0
        held.release()


async def test_turn_waiters_count_against_max_queued() -> None:
    async with steps(max_queued=2) as s:
        limited(s, 1)
        held = await s.controller.acquire("a")
        waiting = await line(s, 2)
        with pytest.raises(QueueFull):
            await s.controller.acquire("a")
        held.release()
        (await waiting[0]).release()
        (await waiting[1]).release()


async def test_an_always_on_model_takes_turns_too() -> None:
    async with steps() as s:
        limited(s, 1, Mode.ALWAYS_ON)
        held = await s.controller.acquire("a")
        assert s.controller.try_slot("a") is None
        [waiter] = await line(s, 1)
        held.release()
        (await waiter).release()


async def test_waiters_of_a_start_are_served_in_arrival_order_under_the_limit() -> None:
    """Three requests wait for a start of a model limited to 2: once it is ready the first two
    get slots, marked as having waited for a start; the third waits for a release."""
    async with steps() as s:
        s.fx.add("a", 4)
        s.fx.update("a", max_concurrent=2)
        tasks = [asyncio.create_task(s.controller.acquire("a", request_id=f"r{n}")) for n in range(3)]
        await until(lambda: s.fx.deps["a"].state is State.STARTING and s.controller.total_waiting == 3)
        assert {row["waits_for"] for row in s.controller.waiting("a")} == {"start"}
        s.fx.ready("a")
        one, two = await tasks[0], await tasks[1]
        assert one.cold and two.cold
        await until(lambda: [row["waits_for"] for row in s.controller.waiting("a")] == ["turn"])
        assert not tasks[2].done()
        one.release()
        three = await tasks[2]
        assert three.cold, "it waited for the start as well"
        two.release()
        three.release()


async def test_cancel_a_waiting_request() -> None:
    async with steps() as s:
        limited(s, 1)
        held = await s.controller.acquire("a")
        first, second = await line(s, 2)
        rows = s.controller.waiting()
        assert [(r["request_id"], r["waits_for"], r["place"]) for r in rows] == [("r0", "turn", 1), ("r1", "turn", 2)]
        assert rows[0]["since"] <= rows[1]["since"] < rows[0]["until"]
        assert s.controller.cancel(rows[1]["id"]) == "a"
        with pytest.raises(Cancelled) as refused:
            await second
        assert refused.value.code == "ondemand_cancelled" and refused.value.status == 503
        assert s.controller.cancel(rows[1]["id"]) is None, "gone already"
        assert s.controller.cancel("w-unknown") is None
        held.release()  # handed to the first
        assert s.controller.cancel(rows[0]["id"]) is None, "served already"
        (await first).release()
        assert s.controller.waiting() == []


async def test_cancel_of_a_queued_request_leaves_the_memory_queue() -> None:
    async with steps(capacity=10) as s:
        s.fx.add("busy", 8, State.READY)
        held = await s.controller.acquire("busy")
        s.fx.add("q", 8)
        task = asyncio.create_task(s.controller.acquire("q", request_id="x"))
        await until(lambda: s.controller.queue_ids() == ["q"])
        [row] = s.controller.waiting()
        assert row["waits_for"] == "memory" and row["deployment_id"] == "q"
        s.controller.cancel(row["id"])
        with pytest.raises(Cancelled):
            await task
        assert s.controller.queue_ids() == [] and s.controller.total_waiting == 0
        held.release()


async def test_shutdown_ends_turns_and_a_release_hands_nothing() -> None:
    async with steps() as s:
        limited(s, 1)
        held = await s.controller.acquire("a")
        [waiter] = await line(s, 1)
        s.controller.shutdown()
        with pytest.raises(ShuttingDown):
            await waiter
        held.release()
        assert s.controller.status("a")["inflight"] == 0
