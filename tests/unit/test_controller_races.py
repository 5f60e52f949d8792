"""The races the spec rules out, driven with random interleavings and repeated many times."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from unit.ondemand_harness import Harness, autostart, harness

from dgxmm.deploy.deployer import Change
from dgxmm.deploy.models import Mode, State
from dgxmm.ondemand.controller import Slot
from dgxmm.ondemand.errors import OndemandError

pytestmark = pytest.mark.timeout(60)


def forbid_busy_stops(h: Harness, violations: list[str]) -> None:
    """Listener: a deployment must never go to stopping while a slot is in flight."""

    def check(change: Change) -> None:
        if change.kind == "state" and change.deployment.state is State.STOPPING:
            track = h.controller._tracks.get(change.deployment.id)
            if track is not None and track.inflight > 0:
                violations.append(f"{change.deployment.id} stopped with {track.inflight} in flight")

    h.deployer.add_listener(check)


async def ticks(rng: random.Random, most: int) -> None:
    for _ in range(rng.randrange(most) if most > 0 else 0):
        await asyncio.sleep(0)


@pytest.mark.parametrize("seed", range(40))
async def test_approved_stop_never_interleaves_with_a_grant(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with harness(tmp_path, idle_timeout_s=60) as h:
        violations: list[str] = []
        forbid_busy_stops(h, violations)
        await h.add("v", 4, state=State.READY)
        h.idle_for(61)
        starter = asyncio.create_task(autostart(h, rng))
        granted: list[Slot] = []

        async def request() -> None:
            await ticks(rng, 30)
            slot = await h.controller.acquire("v")
            assert h.state("v") is State.READY, "a slot is granted only while ready"
            granted.append(slot)
            await ticks(rng, 30)
            slot.release()

        async def reaper() -> None:
            for _ in range(5):
                await ticks(rng, 20)
                await h.controller.reap_once()

        await asyncio.gather(reaper(), *(request() for _ in range(10)))
        starter.cancel()
        assert violations == []
        assert len(granted) == 10 and h.controller.status("v")["inflight"] == 0


def hold_stops(h: Harness) -> asyncio.Event:
    """Make-room's stops wait on the returned event after their victims were picked."""
    gate = asyncio.Event()
    original = h.controller.stop_idle

    async def held(dep, text):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await original(dep, text)

    h.controller.stop_idle = held  # type: ignore[method-assign]
    return gate


async def until(check, limit: int = 10_000) -> None:  # type: ignore[no-untyped-def]
    for _ in range(limit):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_precheck_refuses_a_model_that_got_a_slot_after_it_was_picked(tmp_path: Path) -> None:
    """Make-room picked ``v``; before its stop reached the deployer, ``v`` got a slot: the
    precheck refuses, nothing is recorded, and the request is queued instead."""
    async with harness(tmp_path, capacity=10) as h:
        await h.add("v", 6, state=State.READY)
        h.idle_for(61)
        await h.add("x", 6)
        gate = hold_stops(h)
        task = asyncio.create_task(h.controller.acquire("x"))
        await until(lambda: h.controller.queue_ids() == ["x"])
        slot = await h.controller.acquire("v")
        gate.set()
        await until(lambda: not h.controller._lock.locked())
        assert h.state("v") is State.READY
        assert h.audit("ondemand_sleep") == [] and "Stopped" not in " ".join(h.events("v"))
        assert h.controller.queue_ids() == ["x"]
        slot.release()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_head_reservation_holds_while_a_smaller_model_starts(tmp_path: Path) -> None:
    """The head freed 3 GiB (its other victim turned busy): those 3 GiB stay reserved for it.
    A later 4 GiB model fits in what is free (5) but not beside the reservation: it queues;
    a later 2 GiB model fits beside it and starts."""
    async with harness(tmp_path, capacity=10) as h:
        await h.add("v1", 3, state=State.READY)
        await h.add("v2", 3, state=State.READY)
        await h.add("busy", 2, state=State.READY)
        keep = await h.controller.acquire("busy")
        h.idle_for(61)
        await h.add("head", 8)
        gate = hold_stops(h)
        head = asyncio.create_task(h.controller.acquire("head"))
        await until(lambda: h.controller.queue_ids() == ["head"])
        v2_slot = await h.controller.acquire("v2")  # v2 turns busy before its precheck
        gate.set()
        await until(lambda: h.state("v1") is State.STOPPED)
        h.clock.advance(1)  # past stop_settle_s: the freed memory did not suffice
        while h.controller._lock.locked():
            await asyncio.sleep(0.05)
        assert h.state("v2") is State.READY and h.controller.queue_ids() == ["head"]
        assert h.controller.queue.head().reserved_gib == 3
        assert h.deployer.snapshot().free == 5

        await h.add("mid", 4)
        mid = asyncio.create_task(h.controller.acquire("mid"))
        await until(lambda: h.controller.queue_ids() == ["head", "mid"])
        assert h.state("mid") is State.STOPPED

        await h.add("small", 2)
        small = asyncio.create_task(h.controller.acquire("small"))
        await h.deployer.starting("small")
        h.deployer.finish_start("small")
        (await small).release()
        assert h.controller.queue_ids() == ["head", "mid"]
        assert h.controller.queue.head().reserved_gib == 3

        head.cancel()  # the head gives up: its reservation goes with it
        await asyncio.gather(head, return_exceptions=True)
        assert h.controller.queue_ids() == ["mid"]
        mid.cancel()
        await asyncio.gather(mid, return_exceptions=True)
        keep.release()
        v2_slot.release()
