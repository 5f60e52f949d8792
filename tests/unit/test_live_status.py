"""The live status follows phases by announcement, not by looking at everything in turns (issue 25):
the controller announces each deployment whose on-demand facts changed, the deployer each change
of a record or of the start-up gate, and time-driven changes are looked at when they are due.
Driven on the real deployer and controller with the harness's clock; no sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from unit.ondemand_harness import Harness, behind_the_owners_back, harness, until

from dgxmm.records.deployment import State
from dgxmm.status.history import History
from dgxmm.status.live import QUEUED_POLL_S, LiveStatus

pytestmark = pytest.mark.timeout(15)


class Looks:
    """The live status under test, and what it asked to publish (``now``: the changes of phase,
    published at once; the others folded with the counters)."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.asked: list[str] = []
        self.now: list[str] = []
        self.live = LiveStatus(
            h.deployer, h.controller, History(clock=h.clock), self._ask, clock=h.clock, publish_now=self._ask_now
        )
        h.deployer.add_listener(self.live.on_change)
        self.live.check()  # the first check looks at everything

    def _ask_now(self, deployment_id: str) -> None:
        self.now.append(deployment_id)
        self._ask(deployment_id)

    def _ask(self, deployment_id: str) -> None:
        self.asked.append(deployment_id)
        view_status = self.live.status(self.h.deployer.get(deployment_id))
        self.live.published(deployment_id, view_status)  # as Context does once the view went out

    def check(self) -> list[str]:
        self.asked.clear()
        self.now.clear()
        return self.live.check()

    def code(self, deployment_id: str) -> Any:
        return self.live.status(self.h.deployer.get(deployment_id))["code"]


async def test_an_idle_host_needs_no_look_at_all(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        for name in ("a", "b", "c"):
            await h.add(name, 1, state=State.READY if name != "c" else State.STOPPED)
        looks = Looks(h)
        assert looks.live._next_check_in() is None  # nothing queued, nothing due: no timer
        reads: list[str] = []
        h.deployer.peek = lambda dep_id: reads.append(dep_id)  # type: ignore[method-assign, assignment, func-returns-value]
        assert looks.check() == [] and reads == []  # nothing announced: no deployment looked at


async def test_a_request_joining_the_memory_queue_is_announced_and_published(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=4) as h:
        await h.add("busy", 4, state=State.READY)
        await h.add("x", 4)
        looks = Looks(h)
        slot = await h.controller.acquire("busy")
        looks.check()
        task = asyncio.create_task(h.controller.acquire("x"))
        await until(lambda: (track := h.controller.tracked("x")) is not None and track.waiting == 1)
        assert "x" not in h.controller.queue_ids()  # its waiter came first: looked at as cold
        assert looks.check() == [] and looks.code("x") == "cold"  # "Cold" as it was
        await until(lambda: "x" in h.controller.queue_ids())
        assert looks.check() == ["x"] and looks.code("x") == "queued"
        assert looks.live._next_check_in() == QUEUED_POLL_S  # free memory may move without an event
        slot.release()
        h.idle_for(61)  # "busy" may be stopped for it now
        await h.deployer.starting("x")
        h.deployer.finish_start("x")
        (await task).release()
        assert "x" in looks.check()


async def test_what_the_controller_does_not_announce_is_not_seen(tmp_path: Path) -> None:
    """The other side of the contract: a track changed behind the controller's back stays unseen
    until it is announced (so the tests above fail if the controller stops announcing)."""
    async with harness(tmp_path) as h:
        await h.add("a", 1, state=State.READY)
        looks = Looks(h)
        behind_the_owners_back(h.controller, "a", inflight=2)  # not through a grant: nobody is told
        assert looks.check() == []
        looks.live.mark("a")
        assert looks.check() == ["a"] and looks.code("a") == "serving"
        behind_the_owners_back(h.controller, "a", inflight=0)


async def test_a_start_waiting_at_the_gate_is_announced_when_it_waits_and_when_it_goes_on(tmp_path: Path) -> None:
    async with harness(tmp_path, starts=1) as h:
        await h.add("a", 1)
        await h.add("b", 1)
        looks = Looks(h)
        h.deployer.restart("a", actor="test")
        await h.deployer.starting("a")
        looks.check()
        h.deployer.restart("b", actor="test")
        looks.check()  # loading, its start task not run yet
        assert looks.live.status(h.deployer.get("b"))["waiting_for_gate"] is False
        await until(lambda: h.deployer.waiting_for_gate("b"))
        assert looks.check() == ["b"]
        assert looks.live.status(h.deployer.get("b"))["waiting_for_gate"] is True
        await h.ready("a")
        await until(lambda: not h.deployer.waiting_for_gate("b"))
        assert "b" in looks.check()
        assert looks.live.status(h.deployer.get("b"))["waiting_for_gate"] is False
        await h.ready("b")


async def test_a_backoff_running_out_is_looked_at_when_it_is_due(tmp_path: Path) -> None:
    async with harness(tmp_path, backoff_initial_s=30) as h:
        await h.add("a", 1)
        looks = Looks(h)
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        h.deployer.fail_start("a")
        with pytest.raises(Exception, match="failed to start"):
            await task
        looks.check()
        due = looks.live._next_check_in()
        assert due is not None and 29 <= due <= 30  # the backoff's end, nothing before it
        h.clock.advance(10)
        assert looks.check() == []
        h.clock.advance(21)
        assert looks.check() == ["a"]  # no announcement: the due time brought the look
        assert looks.live.status(h.deployer.get("a"))["until"] is None
        assert looks.live._next_check_in() is None


async def test_run_checks_again_soon_after_an_announcement(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 1, state=State.READY)
        looks = Looks(h)
        checks: list[int] = []
        original = looks.live.check

        def counted() -> list[str]:
            checks.append(1)
            return original()

        looks.live.check = counted  # type: ignore[method-assign]
        runner = asyncio.create_task(looks.live.run())
        try:
            await until(lambda: len(checks) == 1)
            slot = await h.controller.acquire("a")  # announced: the runner wakes and looks
            await asyncio.wait_for(_until_async(lambda: len(checks) == 2), 5)
            assert looks.code("a") == "serving"
            slot.release()
        finally:
            runner.cancel()


async def _until_async(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)


async def test_a_change_of_phase_goes_out_at_once_a_change_of_counts_is_folded(tmp_path: Path) -> None:
    """Issue 30: the page shows "Queued" at once; "Serving 1" becoming "Serving 2" waits for the
    counters' fold (once a second)."""
    async with harness(tmp_path, capacity=4) as h:
        await h.add("busy", 4, state=State.READY)
        await h.add("x", 4)
        looks = Looks(h)
        first = await h.controller.acquire("busy")
        assert looks.check() == ["busy"] and looks.now == ["busy"]  # Idle -> Serving 1: a new phase
        second = await h.controller.acquire("busy")
        assert looks.check() == ["busy"] and looks.now == []  # Serving 2: the count alone, folded
        task = asyncio.create_task(h.controller.acquire("x"))
        await until(lambda: "x" in h.controller.queue_ids())
        assert "x" in looks.check() and "x" in looks.now  # Queued: at once
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        first.release()
        second.release()
