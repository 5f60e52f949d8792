"""What the controller records in dgxmm's metrics, on the real deployer with controllable starts
and clock (issue 13): starts and wakes for requests, stops by reason, start failures, waits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from unit.ondemand_harness import Harness, harness
from unit.test_controller import until

from dgxmm.records.deployment import State
from dgxmm.controller.errors import QueueTimeout, StartFailed
from dgxmm.telemetry import catalog as c
from dgxmm.telemetry.collector import Collector, Sources

pytestmark = pytest.mark.timeout(15)


def load(h: Harness, deployment_id: str) -> tuple[float, float, float]:
    """The in-flight, queued and backoff gauges of one deployment, as a scrape renders them
    from the controller's tracks."""
    collector = Collector(h.metrics, Sources(h.deployer, h.controller, h.sampler, None, "test", "i"))
    found = {m.name: {s.labels.get("deployment"): s.value for s in m.samples} for m in collector.collect()}
    return tuple(found[family.name][deployment_id] for family in (c.INFLIGHT, c.WAITING, c.BACKOFF))  # type: ignore[return-value]


def count(h: Harness, deployment_id: str, family: c.Family, *key: str) -> int:
    stats = h.metrics.of(deployment_id)
    assert stats is not None
    return stats.count(family, key)


def stops(h: Harness, deployment_id: str) -> dict[str, int]:
    """Its make-room and reaper stops (a drain stops none here)."""
    assert count(h, deployment_id, c.STOPS, "drain") == 0
    return {reason: count(h, deployment_id, c.STOPS, reason) for reason in ("make_room", "idle")}


def waits(h: Harness, deployment_id: str) -> dict[str, int]:
    return {outcome: count(h, deployment_id, c.WAITS_ENDED, outcome) for outcome in c.WAIT_OUTCOMES}


async def test_make_room_and_reaper_stops_count_by_reason(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=6) as h:
        await h.add("old", 3, state=State.READY)
        await h.add("other", 3, state=State.READY)
        h.idle_for(61)
        await h.add("x", 3)
        queued: list[int] = []
        task = asyncio.create_task(h.controller.acquire("x", on_queued=lambda: queued.append(1)))
        await h.deployer.starting("x")
        h.deployer.finish_start("x")
        (await task).release()
        stopped = "old" if h.state("old") is State.STOPPED else "other"
        assert stops(h, stopped) == {"make_room": 1, "idle": 0}
        assert count(h, "x", c.STARTS_FOR_REQUESTS) == 1 and count(h, "x", c.QUEUED) == 1 == len(queued)
        assert count(h, "x", c.QUEUE_WAIT) == 1 and count(h, "x", c.WAITS_ENDED, "granted") == 1
        h.idle_for(61)
        reaped = await h.controller.reap_once()
        assert sorted(reaped) == sorted({"old", "other", "x"} - {stopped})
        assert all(stops(h, name) == {"make_room": 0, "idle": 1} for name in reaped)


async def test_a_wake_counts_as_a_wake_not_a_start(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4, state=State.ASLEEP)
        task = asyncio.create_task(h.controller.acquire("a"))
        await until(lambda: h.deployer.wake_calls == ["a"])
        await h.ready("a")
        (await task).release()
        assert (count(h, "a", c.WAKES), count(h, "a", c.STARTS_FOR_REQUESTS)) == (1, 0)


async def test_failed_starts_for_requests_count_and_backoff_shows_in_its_gauge(tmp_path: Path) -> None:
    async with harness(tmp_path, backoff_initial_s=60) as h:
        await h.add("a", 4)
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        h.deployer.fail_start("a")
        with pytest.raises(StartFailed):
            await task
        assert count(h, "a", c.START_FAILURES) == 1
        assert waits(h, "a") == {"granted": 0, "refused": 1, "gone": 0}
        assert count(h, "a", c.QUEUE_WAIT) == 0
        assert load(h, "a") == (0, 0, 60.0)
        h.clock.advance(45)
        assert load(h, "a")[2] == 15.0
        await h.add("b", 1, state=State.FAILED)  # a start nobody asked for through the gateway
        assert count(h, "b", c.START_FAILURES) == 0


async def test_waits_are_measured_from_arrival_and_by_how_they_ended(tmp_path: Path) -> None:
    async with harness(tmp_path, queue_timeout_s=30) as h:
        await h.add("a", 4)
        arrival = h.clock()
        timed_out = asyncio.create_task(h.controller.acquire("a", arrival=arrival - 5))
        await h.deployer.starting("a")
        gone = asyncio.create_task(h.controller.acquire("a"))
        await until(lambda: load(h, "a")[1] == 2)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        h.clock.advance(25)
        h.controller.notify()
        with pytest.raises(QueueTimeout):
            await timed_out
        assert waits(h, "a") == {"granted": 0, "refused": 1, "gone": 1}
        assert load(h, "a") == (0, 0, 0.0)
