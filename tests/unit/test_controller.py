"""Controller rules, each driven on the real deployer with controllable starts and clock."""

from __future__ import annotations

import asyncio
import traceback
from pathlib import Path

import pytest
from unit.ondemand_harness import harness, until

from dgxmm.deploy.budget import Reading
from dgxmm.records.deployment import Mode, Role, State
from dgxmm.controller.errors import (
    DoesNotFit,
    NoSuchDeployment,
    QueueFull,
    QueueTimeout,
    StartFailed,
    Stopped,
)

pytestmark = pytest.mark.timeout(15)


async def test_slot_at_once_when_ready_and_release_is_idempotent(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4, state=State.READY)
        slot = await h.controller.acquire("a")
        assert h.controller.status("a")["inflight"] == 1
        assert h.controller.status("a")["phase"] == "serving"
        slot.release()
        slot.release()
        assert h.controller.status("a")["inflight"] == 0
        assert h.controller.status("a")["last_request_at"] is not None


async def test_burst_of_first_requests_starts_the_model_once(tmp_path: Path) -> None:
    async with harness(tmp_path, max_queued=2000) as h:
        await h.add("a", 4)
        tasks = [asyncio.create_task(h.controller.acquire("a")) for _ in range(1000)]
        await h.deployer.starting("a")
        for _ in range(50):  # the engine loads a while: every waiter looks again meanwhile
            await asyncio.sleep(0)
        assert h.deployer.start_calls == ["a"]
        assert h.controller.status("a") == {**h.controller.status("a"), "queued": 1000, "phase": "starting_for_request"}
        h.deployer.finish_start("a")
        slots = await asyncio.gather(*tasks)
        assert h.deployer.start_calls == ["a"] and h.runtime.started == ["a"]
        assert h.controller.status("a")["inflight"] == 1000
        for slot in slots:
            slot.release()
        assert h.controller.status("a")["inflight"] == 0 and h.controller.total_waiting == 0
        assert h.events("a").count("Started for a request") == 1
        assert len(h.audit("ondemand_start")) == 1


async def test_a_failed_start_gives_each_waiter_its_own_error(tmp_path: Path) -> None:
    """A burst whose start fails: every request gets start_failed, each its own exception, so no
    traceback collects the frames of all the others."""
    async with harness(tmp_path, max_queued=500) as h:
        await h.add("a", 4)
        tasks = [asyncio.create_task(h.controller.acquire("a")) for _ in range(300)]
        await h.deployer.starting("a")
        h.deployer.fail_start("a")
        errors = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(e, StartFailed) for e in errors)
        assert len({id(e) for e in errors}) == 300
        assert max(len(traceback.extract_tb(e.__traceback__)) for e in errors) < 10


async def test_queue_full_fails_at_once(tmp_path: Path) -> None:
    async with harness(tmp_path, max_queued=3) as h:
        await h.add("a", 4)
        await h.add("b", 4, state=State.READY)
        waiting = [asyncio.create_task(h.controller.acquire("a")) for _ in range(3)]
        await until(lambda: h.controller.total_waiting == 3)
        with pytest.raises(QueueFull) as err:
            await h.controller.acquire("a")
        assert err.value.retry_after == 60 and err.value.code == "ondemand_queue_full"
        (await h.controller.acquire("b")).release()  # a ready model still gets a slot at once
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert h.controller.total_waiting == 0


async def test_deadline_counts_from_arrival(tmp_path: Path) -> None:
    async with harness(tmp_path, queue_timeout_s=100) as h:
        await h.add("a", 4)
        task = asyncio.create_task(h.controller.acquire("a", arrival=h.clock() - 99))
        await h.deployer.starting("a")
        h.clock.advance(1.5)  # the cold start used up the rest of the deadline
        h.controller.notify()
        with pytest.raises(QueueTimeout):
            await task
        assert any("timed out after 100 s" in t for t in h.events("a"))
        assert len(h.audit("ondemand_queue_timeout")) == 1
        assert h.controller.total_waiting == 0


@pytest.mark.parametrize("state", [State.STARTING, State.STOPPING])
async def test_other_states_are_waited_on_not_started(tmp_path: Path, state: State) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4, state=State.READY if state is State.STOPPING else State.STARTING)
        if state is State.STOPPING:
            h.runtime.stop_gate = asyncio.Event()
            stop = asyncio.create_task(h.deployer.stop("a", actor="api"))
            await until(lambda: h.state("a") is State.STOPPING)
        task = asyncio.create_task(h.controller.acquire("a"))
        for _ in range(100):
            await asyncio.sleep(0)
        assert not task.done() and h.deployer.start_calls == ["a"]  # only the harness's own start
        if state is State.STOPPING:  # stopped: now it is started for the request
            h.runtime.stop_gate.set()
            await stop
            await h.deployer.starting("a")
            assert h.deployer.start_calls == ["a", "a"]
        h.deployer.finish_start("a")
        (await task).release()


async def test_asleep_is_woken(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4, state=State.ASLEEP)
        task = asyncio.create_task(h.controller.acquire("a"))
        await until(lambda: h.deployer.wake_calls == ["a"])
        await h.ready("a")
        (await task).release()


async def test_failed_is_restarted(tmp_path: Path) -> None:
    async with harness(tmp_path, backoff_initial_s=60) as h:
        await h.add("a", 4, state=State.FAILED)
        h.clock.advance(61)  # past the backoff of the failure the harness made
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        h.deployer.finish_start("a")
        (await task).release()


async def test_does_not_fit_fails_at_once(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await h.add("fixed", 4, state=State.READY, mode=Mode.ALWAYS_ON)
        await h.add("huge", 7)
        with pytest.raises(DoesNotFit, match="more than the 6.0 GiB"):
            await h.controller.acquire("huge")
        assert h.controller.queue_ids() == [] and h.controller.total_waiting == 0


async def test_does_not_fit_waits_within_the_grace_of_an_on_demand_stop(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10, stop_settle_s=20) as h:
        await h.add("fixed", 4, state=State.READY, mode=Mode.ALWAYS_ON)
        await h.add("idle", 2, state=State.READY)
        h.idle_for(61)
        assert await h.controller.reap_once() == ["idle"]
        await h.add("huge", 7)
        task = asyncio.create_task(h.controller.acquire("huge"))
        await until(lambda: h.controller.queue_ids() == ["huge"])
        h.clock.advance(21)  # the grace is over: it can never fit
        h.controller.notify()
        with pytest.raises(DoesNotFit):
            await task


async def test_make_room_stops_least_recently_used_until_covered(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        for name in ("old", "mid", "new"):
            await h.add(name, 3, state=State.READY)
            (await h.controller.acquire(name)).release()
            h.clock.advance(1)
        h.idle_for(60)
        await h.add("x", 5)  # free 1, shortfall 4: "old" and "mid" (3 + 3), not "new"
        queued: list[int] = []
        task = asyncio.create_task(h.controller.acquire("x", on_queued=lambda: queued.append(1)))
        await h.deployer.starting("x")
        assert h.state("old") is State.STOPPED and h.state("mid") is State.STOPPED
        assert h.state("new") is State.READY
        assert queued == [1], "a request that waited for memory gets the queued notice once"
        h.deployer.finish_start("x")
        (await task).release()
        assert h.events("old")[-1] == "Stopped to make room for x"
        assert len(h.audit("ondemand_sleep")) == 2


async def test_make_room_waits_for_the_freed_memory_to_show(tmp_path: Path) -> None:
    """On a measured budget the victim's memory reads as used for a while after its stop: the
    head settles (looks again every poll) instead of giving up, and starts once it shows."""
    reading = Reading(total=10, available=10)
    async with harness(tmp_path, capacity=10, reader=lambda: reading) as h:
        await h.add("v", 6, state=State.READY)
        reading = Reading(total=10, available=4)  # v's engine uses its memory
        h.idle_for(61)
        await h.add("x", 6)
        task = asyncio.create_task(h.controller.acquire("x"))
        await until(lambda: h.state("v") is State.STOPPED)
        for _ in range(50):
            await asyncio.sleep(0)
        assert h.state("x") is State.STOPPED and h.controller.queue_ids() == ["x"]
        reading = Reading(total=10, available=10)  # the engine's memory is given back
        h.clock.advance(0.1)  # one settle poll later (no event says so)
        await h.deployer.starting("x")
        h.deployer.finish_start("x")
        (await task).release()


async def test_not_enough_victims_stops_none_and_queues(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await h.add("idle", 3, state=State.READY)
        await h.add("busy", 3, state=State.READY)
        await h.add("fresh", 3, state=State.READY)
        h.idle_for(61)
        busy = await h.controller.acquire("busy")  # a slot in flight
        h.sampler.busy("fresh")  # its engine reports running requests
        await h.add("x", 5)
        notices: list[int] = []
        task = asyncio.create_task(h.controller.acquire("x", on_queued=lambda: notices.append(1)))
        await until(lambda: h.controller.queue_ids() == ["x"] and notices == [1])
        assert all(h.state(n) is State.READY for n in ("idle", "busy", "fresh"))
        assert h.controller.status("x")["phase"] == "queued"
        busy.release()  # now busy is idle too, once its timeout runs out again
        h.idle_for(61)
        h.controller.notify()
        await h.deployer.starting("x")
        assert h.state("idle") is State.STOPPED and h.state("busy") is State.STOPPED
        assert h.state("fresh") is State.READY and notices == [1]
        h.deployer.finish_start("x")
        (await task).release()


async def test_victims_need_a_fresh_sample(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10, metrics_max_age_s=60) as h:
        await h.add("v", 6, state=State.READY)
        h.sampler.busy("v", running=0)  # idle, but the sample will be old
        h.clock.advance(61)
        await h.add("x", 6)
        task = asyncio.create_task(h.controller.acquire("x"))
        await until(lambda: h.controller.queue_ids() == ["x"])
        assert h.state("v") is State.READY
        h.sampler.samples["v"] = None  # no sample at all: still never a victim
        h.controller.notify()
        await asyncio.sleep(0)
        assert h.state("v") is State.READY
        task.cancel()


async def test_hang_up_leaves_the_queue_and_counters_fall_back(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10) as h:
        await h.add("busy", 8, state=State.READY)
        slot = await h.controller.acquire("busy")
        await h.add("x", 5)
        task = asyncio.create_task(h.controller.acquire("x"))
        await until(lambda: h.controller.queue_ids() == ["x"])
        assert h.controller.status("x")["queued"] == 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert h.controller.queue_ids() == [] and h.controller.total_waiting == 0
        assert h.controller.status("x") == {"inflight": 0, "queued": 0, "last_request_at": None, "phase": "sleeping"}
        slot.release()


async def test_hang_up_at_the_moment_of_the_grant_leaks_no_slot(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4)
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        h.deployer.finish_start("a")
        await until(lambda: h.state("a") is State.READY)
        task.cancel()  # the waiter was woken for the grant but has not run yet
        results = await asyncio.gather(task, return_exceptions=True)
        if not isinstance(results[0], asyncio.CancelledError):
            results[0].release()  # it won the race: the caller releases (the gateway does)
        assert h.controller.status("a")["inflight"] == 0 and h.controller.total_waiting == 0


async def test_attempt_starts_nothing_when_no_one_waits(tmp_path: Path) -> None:
    """x's attempt is waiting for its victim to stop when x's only request hangs up: once the
    stop is done, the attempt decides again, finds nobody waiting and starts nothing."""
    async with harness(tmp_path, capacity=10) as h:
        await h.add("v", 6, state=State.READY)
        h.idle_for(61)
        await h.add("x", 6)
        h.runtime.stop_gate = asyncio.Event()
        task = asyncio.create_task(h.controller.acquire("x"))
        await until(lambda: h.state("v") is State.STOPPING)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        h.runtime.stop_gate.set()
        await until(lambda: h.state("v") is State.STOPPED)
        await h.quiet()
        assert h.deployer.start_calls == ["v"] and h.state("x") is State.STOPPED
        assert h.controller.queue_ids() == []


async def test_waiter_hang_up_never_cancels_the_start(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4)
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert h.state("a") is State.STARTING
        h.deployer.finish_start("a")
        await h.settled("a")
        assert h.state("a") is State.READY


async def test_stopped_while_starting_gives_ondemand_stopped_without_backoff(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4)
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        await h.deployer.stop("a", actor="api")
        with pytest.raises(Stopped):
            await task
        task = asyncio.create_task(h.controller.acquire("a"))  # the next request starts it again
        await h.deployer.starting("a")
        h.deployer.finish_start("a")
        (await task).release()


async def test_removed_while_starting_or_waiting(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4)
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        await h.deployer.remove("a", actor="api")
        with pytest.raises(Stopped):
            await task
        await h.add("busy", 8, state=State.READY)
        slot = await h.controller.acquire("busy")
        await h.add("b", 5)
        task = asyncio.create_task(h.controller.acquire("b"))
        await until(lambda: h.controller.queue_ids() == ["b"])
        await h.deployer.remove("b", actor="api")
        with pytest.raises(NoSuchDeployment):
            await task
        assert h.controller.queue_ids() == []
        slot.release()
        with pytest.raises(NoSuchDeployment):
            await h.controller.acquire("nope")


async def test_start_failure_backoff_doubles_and_resets(tmp_path: Path) -> None:
    async with harness(tmp_path, backoff_initial_s=60, backoff_max_s=150) as h:
        await h.add("a", 4)

        async def fail_once() -> None:
            task = asyncio.create_task(h.controller.acquire("a"))
            await h.deployer.starting("a")
            h.deployer.fail_start("a")
            with pytest.raises(StartFailed):
                await task

        await fail_once()
        with pytest.raises(StartFailed, match="refused for 60 s"):
            await h.controller.acquire("a")
        h.clock.advance(60)
        await fail_once()
        with pytest.raises(StartFailed, match="refused for 120 s"):
            await h.controller.acquire("a")
        h.clock.advance(120)
        await fail_once()
        assert h.controller.track("a").backoff_s == 150  # capped
        await h.controller.set_mode("a", Mode.ON_DEMAND, None, user="admin")  # resets it
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        h.deployer.fail_start("a")
        with pytest.raises(StartFailed):
            await task
        assert h.controller.track("a").backoff_s == 60
        h.deployer._ledger.edit("a", {"args": ["--changed"]})  # a changed configuration resets it too
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        h.deployer.finish_start("a")
        (await task).release()
        assert h.controller.track("a").backoff_s == 0  # and so does a successful start


async def test_reaper_stops_idle_models_only(tmp_path: Path) -> None:
    async with harness(tmp_path, idle_timeout_s=120) as h:
        await h.add("idle", 2, state=State.READY)
        await h.add("short", 2, state=State.READY, idle_timeout_s=60)
        await h.add("busy", 2, state=State.READY)
        await h.add("always", 2, state=State.READY, mode=Mode.ALWAYS_ON)
        slot = await h.controller.acquire("busy")
        h.idle_for(61)
        assert await h.controller.reap_once() == ["short"]
        h.idle_for(60)
        assert await h.controller.reap_once() == ["idle"]
        assert h.events("short")[-1] == "Stopped after 1 min idle"
        assert h.events("idle")[-1] == "Stopped after 2 min idle"
        assert h.state("busy") is State.READY and h.state("always") is State.READY
        slot.release()  # the release restarts the idle timer
        h.idle_for(119)
        assert await h.controller.reap_once() == []
        h.idle_for(2)
        assert await h.controller.reap_once() == ["busy"]


async def test_idle_timeout_0_is_never_reaped_but_make_room_stops_it_once_idle(tmp_path: Path) -> None:
    """llama-swap's ``ttl: 0`` (issue 51 item 3): the reaper passes it by however long it idles;
    a start that needs its memory stops it as soon as nothing is in flight on it."""
    async with harness(tmp_path, capacity=10, idle_timeout_s=60) as h:
        await h.add("kept", 6, state=State.READY, idle_timeout_s=0)
        await h.add("other", 2, state=State.READY)
        h.idle_for(10**6)
        assert await h.controller.reap_once() == ["other"]
        assert h.state("kept") is State.READY
        slot = await h.controller.acquire("kept")  # in flight: no victim while it is
        await h.add("x", 6)
        task = asyncio.create_task(h.controller.acquire("x"))
        await until(lambda: h.controller.queue_ids() == ["x"])
        assert h.state("kept") is State.READY
        slot.release()  # idle now: no timeout to wait for
        h.controller.notify()
        await h.deployer.starting("x")
        assert h.state("kept") is State.STOPPED and h.events("kept")[-1] == "Stopped to make room for x"
        h.deployer.finish_start("x")
        (await task).release()


async def test_idle_timer_restarts_when_ready_and_when_switched_to_on_demand(tmp_path: Path) -> None:
    async with harness(tmp_path, idle_timeout_s=60) as h:
        await h.add("a", 2)
        h.clock.advance(100)
        task = asyncio.create_task(h.controller.acquire("a"))
        await h.deployer.starting("a")
        h.clock.advance(50)
        h.deployer.finish_start("a")
        (await task).release()
        await h.add("b", 2, state=State.READY, mode=Mode.ALWAYS_ON)
        h.idle_for(59)
        await h.controller.set_mode("b", Mode.ON_DEMAND, None, user="admin")
        h.idle_for(2)
        assert await h.controller.reap_once() == ["a"]
        h.idle_for(59)
        assert await h.controller.reap_once() == ["b"]


async def test_dgxmm_restart_waits_a_full_idle_timeout(tmp_path: Path) -> None:
    """A new controller (dgxmm restarted) starts every idle timer at the moment it first sees it."""
    async with harness(tmp_path, idle_timeout_s=60) as h:
        await h.add("a", 2, state=State.READY)
        h.idle_for(1000)
        from dgxmm.controller.controller import Controller
        from dgxmm.controller.effects import DeployerEffects

        fresh = Controller(
            h.controller.settings,
            DeployerEffects(h.deployer, h.sampler, h.bus),
            print,  # type: ignore[arg-type]
            clock=h.clock,
        )
        assert await fresh.reap_once() == []
        h.idle_for(60)
        assert await fresh.reap_once() == ["a"]
        fresh.close()


async def test_try_slot_grants_only_when_ready(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await h.add("a", 4)
        assert h.controller.try_slot("a") is None and h.controller.try_slot("nope") is None
        await h.add("r", 4, state=State.READY)
        slot = h.controller.try_slot("r")
        assert slot is not None and h.controller.status("r")["inflight"] == 1
        slot.release()
        await h.add("d", 1, state=State.READY, mode=Mode.ALWAYS_ON, role=Role.DECIDER)
        assert h.controller.try_slot("d") is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (3, "3 s"),
        (0.5, "0.5 s"),
        (45, "45 s"),
        (60, "1 min"),
        (90, "90 s"),
        (120, "2 min"),
        (600, "10 min"),
        (3600, "1 h"),
        (5400, "1 h 30 min"),
        (7200, "2 h"),
        (86400, "24 h"),
    ],
)
def test_idle_times_read_as_a_person_writes_them(seconds: float, text: str) -> None:
    from dgxmm.controller.texts import duration, idle_stop

    assert duration(seconds) == text
    assert idle_stop(seconds) == f"Stopped after {text} idle"
