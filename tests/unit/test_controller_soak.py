"""Randomised soak: hundreds of requests over several deployments with random hang-ups, start
failures, crashes, reaper passes and clock jumps. At the end nothing is leaked or left hanging.

Nothing here wakes the waiters by hand: they wake on the controller's own notifications and on
their timers, which fire as the clock jumps (as real time would), so a lost wake-up shows as a
request that hangs. The soak also checks that it exercised what it claims: make-room stops,
reaper stops, failed starts and does_not_fit all happened."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from unit.ondemand_harness import autostart, harness
from unit.test_controller_races import forbid_busy_stops, ticks

from dgxmm.records.deployment import State
from dgxmm.controller.errors import OndemandError

pytestmark = pytest.mark.timeout(120)

MAX_JUMP = 30  # the largest clock jump: a waiter sees its deadline at the next wake
SIZES = {"a": 2, "b": 3, "c": 4, "d": 5, "e": 6, "huge": 11}  # huge: more than the capacity
WEIGHTS = [5, 5, 5, 5, 5, 1]


@pytest.mark.parametrize("seed", range(int(os.environ.get("SOAK_SEEDS", "6"))))
async def test_soak(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    timeout = 300.0
    async with harness(
        tmp_path,
        capacity=10,
        idle_timeout_s=60,
        queue_timeout_s=timeout,
        max_queued=150,
        backoff_initial_s=5,
        backoff_max_s=20,
        reaper_interval_s=1,
    ) as h:
        violations: list[str] = []
        forbid_busy_stops(h, violations)
        for name, gib in SIZES.items():
            await h.add(name, gib)
        starter = asyncio.create_task(autostart(h, rng, fail_rate=0.25))
        outcomes: dict[str, int] = {}
        late: list[str] = []

        async def request(i: int) -> None:
            await ticks(rng, 3000)  # spread over the chaos, so models idle out between requests
            name = rng.choices(list(SIZES), WEIGHTS)[0]
            arrival = h.clock()
            hang_up_after = rng.randrange(200) if rng.random() < 0.2 else None
            task = asyncio.create_task(h.controller.acquire(name, arrival=arrival))
            if hang_up_after is not None:
                await ticks(rng, hang_up_after)
                task.cancel()
            try:
                slot = await task
            except asyncio.CancelledError:
                outcomes["hung up"] = outcomes.get("hung up", 0) + 1
                return
            except OndemandError as exc:
                outcomes[exc.code] = outcomes.get(exc.code, 0) + 1
                if h.clock() > arrival + timeout + MAX_JUMP:
                    late.append(f"request {i} ended {h.clock() - arrival:.0f} s after arrival")
                return
            outcomes["slot"] = outcomes.get("slot", 0) + 1
            if h.clock() > arrival + timeout + MAX_JUMP:
                late.append(f"request {i} got its slot {h.clock() - arrival:.0f} s after arrival")
            await ticks(rng, 100)
            slot.release()

        async def chaos() -> None:
            """Clock jumps (idle timeouts, deadlines, backoff), reaper passes and crashes."""
            for _ in range(400):
                await ticks(rng, 20)
                h.clock.advance(rng.choice([0.5, 1, 5, MAX_JUMP]))
                for _ in range(3):  # let every waiter whose timer fired look at the new time
                    await asyncio.sleep(0)
                if rng.random() < 0.3:
                    await h.controller.reap_once()
                if rng.random() < 0.03:
                    ready = [d.id for d in h.deployer.all() if d.state is State.READY]
                    if ready:
                        await h.deployer.fail(rng.choice(ready), "engine exited (exit code 137)")

        requests = [asyncio.create_task(request(i)) for i in range(300)]
        chaos_task = asyncio.create_task(chaos())
        await asyncio.gather(*requests)
        chaos_task.cancel()
        await asyncio.gather(chaos_task, return_exceptions=True)
        starter.cancel()
        await asyncio.gather(starter, return_exceptions=True)

        assert violations == [], "a deployment holding a slot was stopped"
        assert late == []
        assert sum(outcomes.values()) == 300
        assert outcomes.get("slot", 0) > 50, outcomes
        assert h.controller.total_waiting == 0 and h.controller.queue_ids() == []
        for name in SIZES:
            status = h.controller.status(name)
            assert (status["inflight"], status["queued"]) == (0, 0), (name, status)
        texts = [text for name in SIZES for text in h.events(name)]
        exercised = {
            "make-room stops": sum("to make room for" in t for t in texts),
            "reaper stops": sum(t.startswith("Stopped after") and t.endswith(" idle") for t in texts),
            "failed starts": sum(t.startswith("Failed: engine exited (exit code 1)") for t in texts),
            "does_not_fit": outcomes.get("does_not_fit", 0),
        }
        print(seed, outcomes, exercised)
        assert exercised["make-room stops"] >= 3 and exercised["reaper stops"] >= 1, exercised
        assert exercised["failed starts"] >= 2 and exercised["does_not_fit"] >= 3, exercised
