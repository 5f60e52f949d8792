"""A sleep waits for the requests in flight (issue 52 item 2, ``Controller.sleep``), driven step
by step on the fake effects and the tests' clock: no new slot while it waits, the sleep right
after the last release, the waiters then waking it; and past ``sleep_drain_s`` a 409 that leaves
the deployment serving."""

from __future__ import annotations

import asyncio

import pytest
from unit.fake_effects import Steps, steps
from unit.ondemand_harness import until

from dgxmm.errors import Conflict
from dgxmm.records.deployment import State

pytestmark = pytest.mark.timeout(15)


def drained(s: Steps) -> bool:
    track = s.controller.state.tracks.get("a")
    return track is not None and track.drained_for is not None


async def test_a_sleep_waits_for_the_last_release_and_hands_no_slot_out_meanwhile() -> None:
    async with steps() as s:
        s.fx.add("a", 4, State.READY)
        held = await s.controller.acquire("a")
        sleeping = asyncio.create_task(s.controller.sleep("a", actor="api"))
        await until(lambda: drained(s))
        newcomer = asyncio.create_task(s.controller.acquire("a"))
        await until(lambda: s.controller.total_waiting == 1)
        assert ("sleep", "a") not in s.fx.calls and s.fx.deps["a"].state is State.READY
        held.release()  # the last one: the sleep goes ahead
        await sleeping
        await until(lambda: ("wake", "a") in s.fx.calls)
        assert s.fx.calls.index(("sleep", "a")) < s.fx.calls.index(("wake", "a"))  # then its waiter wakes it
        s.fx.set_state("a", State.READY)
        (await newcomer).release()
        assert not drained(s)


async def test_a_sleep_past_its_drain_is_refused_and_the_deployment_serves_on() -> None:
    async with steps(sleep_drain_s=5) as s:
        s.fx.add("a", 4, State.READY)
        held = await s.controller.acquire("a")
        sleeping = asyncio.create_task(s.controller.sleep("a", actor="api"))
        await until(lambda: drained(s))
        s.clock.advance(5)
        with pytest.raises(Conflict, match=r"1 request\(s\) still in flight after 5 s"):
            await sleeping
        assert ("sleep", "a") not in s.fx.calls and not drained(s)
        (await s.controller.acquire("a")).release()  # a newcomer is served at once
        held.release()


async def test_an_idle_deployment_sleeps_at_once() -> None:
    async with steps() as s:
        s.fx.add("a", 4, State.READY)
        await s.controller.sleep("a", actor="api")
        assert s.fx.calls == [("sleep", "a")] and s.fx.deps["a"].state is State.ASLEEP
