"""Swap scheduling (issue 28) on the real deployer with controllable starts and clock: make-room's
own idle rule (``evict_idle_s``), draining busy models for a request that waited its turn
(``max_drain_wait_s``) with nothing lost and no ping-pong, one start per model for interleaved
first requests, and the seed's rule kept by default. No wall-clock sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from unit.ondemand_harness import Harness, behind_the_owners_back, harness, until

from dgxmm.controller.slots import Slot
from dgxmm.records.deployment import State
from dgxmm.telemetry import catalog as c

pytestmark = pytest.mark.timeout(15)


async def start_of(h: Harness, name: str) -> None:
    """Let the start of ``name`` finish (the engine becomes ready)."""
    await h.deployer.starting(name)
    h.deployer.finish_start(name)


async def settle(h: Harness) -> None:
    """Let the waiters whose timers the clock fired look again, and their attempts decide."""
    for _ in range(200):
        await asyncio.sleep(0)
    await h.quiet()


async def served(h: Harness, task: asyncio.Task[Slot]) -> None:
    (await task).release()


async def test_with_evict_idle_0_the_other_model_swaps_in_as_soon_as_nothing_is_in_flight(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=4, evict_idle_s=0) as h:
        await h.add("chat", 4, state=State.READY)
        await h.add("coder", 4)
        (await h.controller.acquire("chat")).release()  # used a moment ago: its idle timeout is far
        task = asyncio.create_task(h.controller.acquire("coder"))
        await start_of(h, "coder")  # no clock moved: chat was stopped at once
        await served(h, task)
        assert h.state("chat") is State.STOPPED and "Stopped to make room for coder" in h.events("chat")
        assert h.metrics.of("chat").count(c.STOPS, ("make_room",)) == 1  # type: ignore[union-attr]


async def test_by_default_a_model_idle_for_less_than_its_timeout_is_not_stopped(tmp_path: Path) -> None:
    """The seed's rule, with every default but the harness's short timeouts: the request waits
    for the other model's whole idle timeout, and the drain (30 s) does not shorten it, because
    that model served nothing while the request waited."""
    async with harness(tmp_path, capacity=4, idle_timeout_s=120, max_drain_wait_s=30) as h:
        await h.add("chat", 4, state=State.READY)
        await h.add("coder", 4)
        (await h.controller.acquire("chat")).release()
        task = asyncio.create_task(h.controller.acquire("coder"))
        await until(lambda: h.controller.queue_ids() == ["coder"])
        h.idle_for(60)  # past the drain's wait, short of chat's idle timeout
        await settle(h)
        assert h.state("chat") is State.READY and h.deployer.start_calls == ["chat"]
        h.idle_for(61)
        await start_of(h, "coder")
        await served(h, task)
        assert h.state("chat") is State.STOPPED


async def test_a_busy_model_is_drained_for_a_request_that_waited_and_nothing_is_lost(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=4, max_drain_wait_s=3, evict_idle_s=0) as h:
        await h.add("chat", 4, state=State.READY)
        await h.add("coder", 4)
        running = await h.controller.acquire("chat")  # an agent loop's request, in flight
        queued: list[str] = []
        coder = asyncio.create_task(h.controller.acquire("coder", on_queued=lambda: queued.append("coder")))
        await until(lambda: h.controller.queue_ids() == ["coder"])
        h.idle_for(2)
        await h.quiet()
        early = h.controller.try_slot("chat")  # not drained yet: chat still gets slots
        assert early is not None
        early.release()
        h.idle_for(1.5)  # the head waited its 3 s: chat is drained
        await until(lambda: h.controller.tracked("chat").drained_for == "coder")  # type: ignore[union-attr]
        assert h.controller.try_slot("chat") is None  # no new slot while drained...
        later = asyncio.create_task(h.controller.acquire("chat", on_queued=lambda: queued.append("chat")))
        await until(lambda: "chat" in queued)  # ...its new request waits, with the queued notice
        assert h.state("chat") is State.READY  # the request in flight runs to its end
        # What the drain frees is the head's: chat's own waiting request cannot start it again first.
        assert h.controller.state.queue.victims_of_head("chat") == {"chat": 4}
        running.release()
        await start_of(h, "coder")
        await served(h, coder)
        assert h.state("chat") is State.STOPPED and queued == ["coder", "chat"]
        assert "Drained and stopped to make room for coder, which waited its turn" in h.events("chat")
        assert h.metrics.of("chat").count(c.STOPS, ("drain",)) == 1  # type: ignore[union-attr]
        h.idle_for(0.1)  # coder idle: chat's waiting request takes it back, and is served
        await start_of(h, "chat")
        await served(h, later)
        assert h.deployer.start_calls == ["chat", "coder", "chat"]


async def chat_drained_for_coder(h: Harness) -> tuple[Slot, asyncio.Task[Slot]]:
    """chat (ready, one request in flight) drained for coder's request, queued its 3 s: the slot
    in flight and coder's waiting request."""
    await h.add("chat", 4, state=State.READY)
    await h.add("coder", 4)
    running = await h.controller.acquire("chat")
    coder = asyncio.create_task(h.controller.acquire("coder"))
    await until(lambda: h.controller.queue_ids() == ["coder"])
    h.idle_for(3.1)
    await until(lambda: h.controller.tracked("chat").drained_for == "coder")  # type: ignore[union-attr]
    return running, coder


async def test_a_drained_model_is_not_drained_again_before_its_waiting_requests_are_served(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=4, max_drain_wait_s=3, evict_idle_s=0) as h:
        chat_running, coder = await chat_drained_for_coder(h)
        chat_waiting = asyncio.create_task(h.controller.acquire("chat"))
        await until(lambda: h.controller.tracked("chat").waiting == 1)  # type: ignore[union-attr]
        chat_running.release()
        await start_of(h, "coder")
        coder_slot = await coder  # coder busy now; chat's request queues behind it
        assert h.controller.tracked("chat").owed  # type: ignore[union-attr]
        await until(lambda: h.controller.queue_ids() == ["chat"])
        h.idle_for(3.1)  # chat's request waited its turn: coder is drained in its turn
        await until(lambda: h.controller.tracked("coder").drained_for == "chat")  # type: ignore[union-attr]
        coder_slot.release()
        await start_of(h, "chat")
        await served(h, chat_waiting)
        assert not h.controller.tracked("chat").owed  # type: ignore[union-attr]  # served: owed nothing


async def test_an_owed_model_is_not_drained(tmp_path: Path) -> None:
    """A model stopped by a drain while requests waited for it is owed its turn: a third model's
    request cannot drain it again before they are served."""
    async with harness(tmp_path, capacity=4, max_drain_wait_s=3, evict_idle_s=0) as h:
        await h.add("chat", 4, state=State.READY)
        await h.add("coder", 4)
        busy = await h.controller.acquire("chat")
        h.controller.state.owe("chat")  # as a drain leaves it with requests waiting
        coder = asyncio.create_task(h.controller.acquire("coder"))
        await until(lambda: h.controller.queue_ids() == ["coder"])
        h.idle_for(10)
        await settle(h)
        assert h.controller.tracked("chat").drained_for is None and h.state("chat") is State.READY  # type: ignore[union-attr]
        behind_the_owners_back(h.controller, "chat", owed=False)
        busy.release()
        h.idle_for(0.1)
        await start_of(h, "coder")
        await served(h, coder)


async def test_a_drain_ends_when_its_head_gives_up(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=4, max_drain_wait_s=3, evict_idle_s=0) as h:
        running, coder = await chat_drained_for_coder(h)
        coder.cancel()  # the caller hung up
        await asyncio.gather(coder, return_exceptions=True)
        await until(lambda: h.controller.tracked("chat").drained_for is None)  # type: ignore[union-attr]
        (await asyncio.wait_for(h.controller.acquire("chat"), 1)).release()  # chat serves again at once
        running.release()
        assert h.state("chat") is State.READY and h.controller.queue_ids() == []


async def test_interleaved_first_requests_for_two_models_start_each_once(tmp_path: Path) -> None:
    """ABAB with memory for one: the queue holds one entry per model, so A's two requests are
    served together, then B's two: two starts, not four."""
    async with harness(tmp_path, capacity=4, evict_idle_s=0) as h:
        await h.add("a", 4)
        await h.add("b", 4)
        tasks = [asyncio.create_task(h.controller.acquire(name)) for name in ("a", "b", "a", "b")]
        await start_of(h, "a")
        slots = [await tasks[0], await tasks[2]]
        assert not tasks[1].done() and h.controller.queue_ids() == ["b"]
        for slot in slots:
            slot.release()
        await start_of(h, "b")
        for task in (tasks[1], tasks[3]):
            await served(h, task)
        assert h.deployer.start_calls == ["a", "b"]


async def test_preload_starts_what_fits_oldest_first_and_makes_no_room(tmp_path: Path) -> None:
    async with harness(tmp_path, capacity=10, idle_timeout_s=60) as h:
        await h.add("busy", 4, state=State.READY)  # idle now, but a preload never stops it
        await h.add("first", 4, preload=True)
        await h.add("second", 4, preload=True)  # 2 GiB left after first: waits for its request
        await h.add("plain", 1)
        assert h.controller.preload() == ["first"]
        assert h.state("first") is State.STARTING and h.state("second") is State.STOPPED
        assert h.state("busy") is State.READY and h.state("plain") is State.STOPPED
        assert "Preloaded: started with dgxmm, before any request" in h.events("first")
        assert "Not preloaded: it needs 4 GiB and 2.0 GiB is free; its first request starts it" in h.events("second")
        assert len(h.audit("ondemand_preload")) == 1
        await start_of(h, "first")
        await until(lambda: h.state("first") is State.READY)
        h.idle_for(61)  # afterwards reaped like any other
        assert sorted(await h.controller.reap_once()) == ["busy", "first"]
