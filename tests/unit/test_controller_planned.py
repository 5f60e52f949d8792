"""The controller and a deployment whose model a hub names (spec: ``planned`` is a state the
controller waits on without starting it): a request waits while the files come and is served
once they are here; one waiting when the fetch fails gets start_failed with the download's error,
and new requests are refused for the backoff; after it, a request fetches again, which takes no
memory, so nothing is stopped for it; a request still waits at most the queue timeout."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from unit.fakes import FakeModelFiles
from unit.ondemand_harness import Harness, harness, until

from dgxmm.controller.errors import QueueTimeout, StartFailed
from dgxmm.records.deployment import State

pytestmark = pytest.mark.timeout(15)
MODEL = "hf://org/tiny/model.gguf"


async def planned(h: Harness, models: FakeModelFiles, name: str = "a", gib: float = 4) -> str:
    await h.add(name, gib, model=MODEL)
    assert h.state(name) is State.PLANNED
    await until(lambda: models.readiness_of(MODEL).downloading)
    return name


async def test_a_request_waits_while_the_files_come_then_starts_the_engine_on_them(tmp_path: Path) -> None:
    models = FakeModelFiles()
    async with harness(tmp_path, models=models) as h:
        await planned(h, models)
        request = asyncio.create_task(h.controller.acquire("a"))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not request.done() and h.deployer.start_calls == [] and h.runtime.started == []
        assert h.controller.status("a")["queued"] == 1
        models.arrive(MODEL, "/models/snap/model.gguf")
        await h.ready("a")
        slot = await request
        assert h.deployer.start_calls == ["a"]
        assert h.runtime.launched["a"].local_model == "/models/snap/model.gguf"
        slot.release()


async def test_a_failed_fetch_answers_its_waiters_start_failed_and_backs_off_then_fetches_again_without_making_room(
    tmp_path: Path,
) -> None:
    models = FakeModelFiles()
    async with harness(tmp_path, models=models, backoff_initial_s=60) as h:
        await h.add("v", 8, state=State.READY)  # an idle model that make-room could stop
        await planned(h, models)
        waiting = asyncio.create_task(h.controller.acquire("a"))
        await until(lambda: h.controller.status("a")["queued"] == 1)
        models.fail(MODEL, "insufficient_storage: 4.00 GiB remain to download but /m has 1.00 GiB free")
        with pytest.raises(StartFailed, match="insufficient_storage: 4.00 GiB remain"):
            await waiting
        assert h.state("a") is State.FAILED
        with pytest.raises(StartFailed, match="refused"):  # the backoff, as after any failed start
            await h.controller.acquire("a")
        assert models.fetched == [MODEL]
        h.idle_for(61)  # past the backoff; v has been idle long enough to be a victim
        request = asyncio.create_task(h.controller.acquire("a"))
        await until(lambda: models.fetched == [MODEL, MODEL])
        assert h.state("a") is State.PLANNED and h.state("v") is State.READY  # nothing stopped for a fetch
        assert not request.done() and h.runtime.started == ["v"]
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)


async def test_a_request_waits_for_the_files_at_most_the_queue_timeout(tmp_path: Path) -> None:
    models = FakeModelFiles()
    async with harness(tmp_path, models=models, queue_timeout_s=30) as h:
        await planned(h, models)
        request = asyncio.create_task(h.controller.acquire("a"))
        await until(lambda: h.controller.status("a")["queued"] == 1)
        h.clock.advance(31)
        with pytest.raises(QueueTimeout):
            await request
        assert h.state("a") is State.PLANNED  # its files still come


async def test_a_preloaded_one_is_started_once_its_files_are_here_when_it_fits(tmp_path: Path) -> None:
    models = FakeModelFiles()
    async with harness(tmp_path, models=models) as h:
        await h.add("a", 4, model=MODEL, preload=True)
        assert h.state("a") is State.PLANNED and h.controller.preload() == []  # nothing to start yet
        models.arrive(MODEL, "/models/snap/model.gguf")
        await until(lambda: h.deployer.start_calls == ["a"])
        assert h.state("a") is State.STARTING and "Preloaded" in " ".join(h.events("a"))
