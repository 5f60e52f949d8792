"""The readiness wait of a starting engine (dgxmm.deploy.readiness.wait_ready).

The probe schedule is made slow here (``FIRST_PROBE_S`` of an hour) wherever a test is about the
hint or the first probe, so a probe can only come from what the test is about: if it did not,
the wait would run into the test's timeout instead of finishing.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from dgxmm.deploy import readiness
from dgxmm.deploy.readiness import wait_ready


class Engine:
    """A probe that answers False until ``ready``, and output the test makes grow."""

    def __init__(self) -> None:
        self.ready = False
        self.probes = 0
        self.output: int | None = 0
        self.ended = False

    async def probe(self) -> bool:
        self.probes += 1
        return self.ready

    def size(self) -> int | None:
        return self.output

    def check_exit(self) -> None:
        if self.ended:
            raise RuntimeError("engine exited")


def far() -> float:
    return time.monotonic() + 3600


async def test_new_output_is_probed_at_once(monkeypatch) -> None:
    monkeypatch.setattr(readiness, "FIRST_PROBE_S", 3600)
    engine = Engine()
    waiting = asyncio.create_task(
        wait_ready(engine.probe, engine.size, engine.check_exit, max_interval_s=3600, deadline=far())
    )
    await asyncio.sleep(0.05)
    assert engine.probes == 0  # nothing written yet, and the schedule is an hour away
    engine.ready, engine.output = True, 120  # "listening on ..."
    assert await waiting
    assert engine.probes == 1


async def test_a_wake_is_probed_before_any_wait(monkeypatch) -> None:
    monkeypatch.setattr(readiness, "FIRST_PROBE_S", 3600)
    engine = Engine()
    engine.ready, engine.output = True, None
    assert await wait_ready(
        engine.probe, engine.size, engine.check_exit, max_interval_s=3600, deadline=far(), first_at_once=True
    )
    assert engine.probes == 1


async def test_without_output_the_schedule_probes_until_ready() -> None:
    engine = Engine()
    engine.output = None  # a runtime that cannot say

    async def probe() -> bool:
        engine.probes += 1
        return engine.probes >= 4

    assert await wait_ready(probe, engine.size, engine.check_exit, max_interval_s=0.05, deadline=far())
    assert engine.probes == 4


async def test_the_schedule_backs_off_to_the_interval_given(monkeypatch) -> None:
    """Each wait between probes doubles up to ``max_interval_s``: the sleeps asked for say so."""
    engine = Engine()
    engine.output = None
    asked: list[float] = []
    clock = [0.0]
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:  # time passes exactly as asked
        asked.append(seconds)
        clock[0] += seconds
        await real_sleep(0)

    async def probe() -> bool:
        engine.probes += 1
        return engine.probes >= 7

    monkeypatch.setattr(readiness.asyncio, "sleep", sleep)
    monkeypatch.setattr(readiness.time, "monotonic", lambda: clock[0])
    assert await wait_ready(probe, engine.size, engine.check_exit, max_interval_s=0.1, deadline=3600)
    assert [round(s, 3) for s in asked] == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1, 0.1]  # one before each probe


async def test_an_ended_engine_stops_the_wait() -> None:
    engine = Engine()
    engine.ended = True
    with pytest.raises(RuntimeError, match="engine exited"):
        await wait_ready(engine.probe, engine.size, engine.check_exit, max_interval_s=0.05, deadline=far())


async def test_the_deadline_ends_the_wait_with_false() -> None:
    engine = Engine()
    assert not await wait_ready(
        engine.probe, engine.size, engine.check_exit, max_interval_s=0.01, deadline=time.monotonic() + 0.1
    )
    assert engine.probes >= 1
