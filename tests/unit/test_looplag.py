"""The event loop's lag probe (telemetry/looplag.py): a loop blocked by its own work shows in
both histograms, one blocked without computing (a sleep, as a busy machine's wait looks) only in
the lag, and ``worst`` sees a stall that has just ended before the probe's tick records it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from conftest import wait_until

from dgxmm.telemetry.catalog import LAGS
from dgxmm.telemetry.looplag import LoopLag
from dgxmm.telemetry.stats import Buckets

STALL_S = 0.4  # (its CPU part is counted from the tick's due time: at least 0.35 s)


def compute(seconds: float) -> None:
    """Hold the loop's thread computing for ``seconds`` of its own CPU time (on a busy machine
    that takes longer on the wall clock, never less)."""
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass


def over(series: Buckets, bound: float) -> int:
    """Observations above ``bound`` (one of the buckets' bounds)."""
    return sum(series.counts[LAGS.index(bound) + 1 :])


@pytest.fixture
async def probe() -> AsyncIterator[LoopLag]:
    lag = LoopLag()
    task = asyncio.create_task(lag.run())
    await wait_until(lambda: lag.lag.count >= 1, timeout=30)  # ticking
    yield lag
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.bounded
async def test_a_loop_blocked_by_its_own_work_shows_in_both_histograms(probe: LoopLag) -> None:
    ticks = probe.lag.count
    compute(STALL_S)
    await wait_until(lambda: probe.lag.count > ticks, timeout=30)  # the tick that waited has run
    assert over(probe.lag, 0.25) >= 1 and over(probe.lag_cpu, 0.25) == 1  # (a busy machine may add late ticks)
    assert probe.lag.count == probe.lag_cpu.count and probe.lag.sum >= probe.lag_cpu.sum >= 0.25


@pytest.mark.bounded
async def test_a_loop_held_without_computing_shows_as_lag_only(probe: LoopLag) -> None:
    """What a busy machine looks like from inside: the loop's thread did not run."""
    ticks = probe.lag.count
    time.sleep(STALL_S)  # the stall under test: the loop held, its thread not computing
    await wait_until(lambda: probe.lag.count > ticks, timeout=30)
    assert over(probe.lag, 0.25) >= 1 and over(probe.lag_cpu, 0.1) == 0


@pytest.mark.bounded
async def test_worst_counts_a_stall_that_has_just_ended_and_mark_starts_a_window(probe: LoopLag) -> None:
    compute(STALL_S)
    worst = probe.worst()  # before the probe's tick could run
    assert worst.seconds >= STALL_S - probe.interval_s and worst.cpu_s >= STALL_S - probe.interval_s
    probe.mark()
    ticks = probe.lag.count
    await wait_until(lambda: probe.lag.count > ticks + 2, timeout=30)  # a few quiet ticks
    assert probe.worst().cpu_s < 0.1  # (its wall lag may be a busy machine's)
