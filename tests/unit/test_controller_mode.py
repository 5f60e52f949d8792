"""set_mode: the switch to always on waits for the start with pending_mode; the way back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from unit.ondemand_harness import harness

from dgxmm.deploy.budget import InsufficientMemory
from dgxmm.records.deployment import Mode, Role, State
from dgxmm.errors import InvalidInput
from dgxmm.controller.slots import Waiter

pytestmark = pytest.mark.timeout(15)


async def test_ready_deployment_just_stores_the_mode(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4, state=State.READY)
        dep = await h.controller.set_mode("a", Mode.ALWAYS_ON, None, user="admin")
        assert (dep.mode, dep.pending_mode, dep.state) == (Mode.ALWAYS_ON, None, State.READY)
        assert h.deployer.start_calls == ["a"]  # only the harness's own start
        row = h.audit("ondemand_mode")[0]
        assert row["user"] == "admin" and row["old"]["mode"] == "on_demand"
        assert row["new"]["mode"] == "always_on"


async def test_stopped_deployment_is_started_first_with_pending_mode(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4)
        dep = await h.controller.set_mode("a", Mode.ALWAYS_ON, None, user="admin")
        assert (dep.mode, dep.pending_mode, dep.state) == (Mode.ON_DEMAND, Mode.ALWAYS_ON, State.STARTING)
        assert h.controller.status("a")["phase"] != "starting_for_request"
        # A request meanwhile waits for that start instead of starting it itself.
        task = asyncio.create_task(h.controller.acquire("a"))
        await asyncio.sleep(0.01)
        assert h.deployer.start_calls == ["a"] and not task.done()
        h.idle_for(10_000)
        assert await h.controller.reap_once() == []
        await h.ready("a")
        dep = h.deployer.get("a")
        assert (dep.mode, dep.pending_mode, dep.state) == (Mode.ALWAYS_ON, None, State.READY)
        (await task).release()
        assert await h.controller.reap_once() == [], "an always-on model is never reaped"


async def test_asleep_deployment_is_woken(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4, state=State.ASLEEP)
        await h.controller.set_mode("a", Mode.ALWAYS_ON, None, user="admin")
        assert h.deployer.wake_calls == ["a"]
        await h.ready("a")
        assert h.deployer.get("a").mode is Mode.ALWAYS_ON


async def test_never_picked_as_a_victim_while_the_switch_waits(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await h.add("a", 4, state=State.ASLEEP)
        h.idle_for(100)
        await h.controller.set_mode("a", Mode.ALWAYS_ON, None, user="admin")
        h.deployer._ledger._move("a", State.ASLEEP, "", check=False)  # as if the wake had not begun yet
        assert not h.controller.is_idle(h.deployer.get("a"))


async def test_refused_start_clears_the_pending_mode(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await h.add("busy", 8, state=State.READY, mode=Mode.ALWAYS_ON)
        await h.add("a", 4)
        with pytest.raises(InsufficientMemory):
            await h.controller.set_mode("a", Mode.ALWAYS_ON, 300, user="admin")
        dep = h.deployer.get("a")
        assert (dep.mode, dep.pending_mode, dep.state, dep.idle_timeout_s) == (
            Mode.ON_DEMAND,
            None,
            State.STOPPED,
            None,
        )


async def test_failed_start_applies_the_pending_mode_with_the_failure(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4)
        await h.controller.set_mode("a", Mode.ALWAYS_ON, None, user="admin")
        await h.deployer.starting("a")
        h.deployer.fail_start("a")
        await h.settled("a")
        dep = h.deployer.get("a")
        assert (dep.mode, dep.pending_mode, dep.state) == (Mode.ALWAYS_ON, None, State.FAILED)


async def test_switch_to_on_demand_restarts_idle_timer_and_clears_backoff(tmp_path: Path) -> None:
    async with harness(tmp_path, idle_timeout_s=60) as h:
        await h.add("a", 4, state=State.READY, mode=Mode.ALWAYS_ON)
        h.idle_for(1000)
        h.controller.state.start_failed("a", 500)  # as a failed start leaves it
        dep = await h.controller.set_mode("a", Mode.ON_DEMAND, 120, user="admin")
        assert (dep.mode, dep.idle_timeout_s) == (Mode.ON_DEMAND, 120)
        assert h.controller.track("a").refused_until == 0
        h.idle_for(119)
        assert await h.controller.reap_once() == []
        h.idle_for(2)
        assert await h.controller.reap_once() == ["a"]


async def test_decider_is_always_always_on(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("d", 4, mode=Mode.ALWAYS_ON, role=Role.DECIDER)
        with pytest.raises(InvalidInput, match="always always_on"):
            await h.controller.set_mode("d", Mode.ON_DEMAND, None, user="admin")


async def test_waiters_wake_at_most_every_waiter_wake_s_and_at_idle_expiry(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10, waiter_wake_s=15, idle_timeout_s=60) as h:
        await h.add("v", 6, state=State.READY)
        await h.add("x", 6)
        now = h.clock()
        waiter = Waiter("x", deadline=now + 900, on_queued=None)
        assert h.controller._wake_in(waiter, now) == 15
        h.controller.state.enqueue("x")
        h.clock.advance(50)  # v's idle timeout runs out in 10 s: look again then
        assert h.controller._wake_in(waiter, h.clock()) == pytest.approx(10.05)
        assert h.controller._wake_in(Waiter("x", deadline=h.clock() + 2, on_queued=None), h.clock()) == 2
