"""A start that runs out of memory, driven on the real deployer and controller with controllable
starts and clock (unit/ondemand_harness.py): room is made once and it starts again; a second
failure is a failed start with backoff (controller/oomretry.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from unit.ondemand_harness import Harness, harness

from dgxmm.controller import texts
from dgxmm.controller.decide import OomRetry
from dgxmm.controller.errors import StartFailed
from dgxmm.records.deployment import State

pytestmark = pytest.mark.timeout(15)

OOM = (
    "engine exited (exit code 1)\nValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine."
)


async def idle_v_and_x(h: Harness) -> None:
    """10 GiB: v (6 GiB) ready and idle; x (4 GiB) fits beside it by the budget."""
    await h.add("v", 6, state=State.READY)
    (await h.controller.acquire("v")).release()
    h.idle_for(60)
    await h.add("x", 4)


async def test_a_start_out_of_memory_makes_room_for_its_shortfall_and_starts_once_more(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await idle_v_and_x(h)
        task = asyncio.create_task(h.controller.acquire("x"))
        await h.deployer.starting("x")
        assert h.state("v") is State.READY  # it fit by the budget: nothing was stopped for it
        h.deployer.fail_start("x", OOM)
        await h.deployer.starting("x")  # its second engine
        assert h.state("v") is State.STOPPED and h.events("v")[-1] == "Stopped to make room for x"
        assert not task.done(), "its waiter waits for the retry, with no error"
        h.deployer.finish_start("x")
        (await task).release()
        assert h.deployer.start_calls == ["v", "x", "x"]
        assert texts.OOM_RETRY in h.events("x")
        track = h.controller.state.tracks["x"]
        assert (track.backoff_s, track.refused_until, track.oom) == (0.0, 0.0, OomRetry.NONE)


async def test_a_start_out_of_memory_twice_is_a_failed_start_with_backoff(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10, backoff_initial_s=60) as h:
        await idle_v_and_x(h)
        task = asyncio.create_task(h.controller.acquire("x"))
        await h.deployer.starting("x")
        h.deployer.fail_start("x", OOM)
        await h.deployer.starting("x")
        h.deployer.fail_start("x", OOM)
        with pytest.raises(StartFailed):
            await task
        assert h.deployer.start_calls == ["v", "x", "x"]
        track = h.controller.state.tracks["x"]
        assert (track.backoff_s, track.refused_until, track.oom) == (60, h.clock() + 60, OomRetry.NONE)
        with pytest.raises(StartFailed):  # within the backoff: refused at once, no third start
            await h.controller.acquire("x")
        assert h.deployer.start_calls == ["v", "x", "x"]


async def test_a_start_that_fails_for_another_reason_is_not_retried(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await idle_v_and_x(h)
        task = asyncio.create_task(h.controller.acquire("x"))
        await h.deployer.starting("x")
        h.deployer.fail_start("x", "engine exited (exit code 1)\nsimulated start failure")
        with pytest.raises(StartFailed):
            await task
        assert h.deployer.start_calls == ["v", "x"] and h.state("v") is State.READY
