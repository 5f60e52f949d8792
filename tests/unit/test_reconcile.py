"""reconcile() after a dgxmm restart: every engine left running is adopted into a state that counts
its memory, or stopped and removed; none is left behind a stopped deployment.

The runtime is a double whose ``adopt`` reports engines "left running"; their health and model
list are answered by a real HTTP server in the test, so the deployer's own probes decide.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from unit.fakes import FakeRuntime

from dgxmm.deploy.budget import MemoryBudget
from dgxmm.deploy.deployer import Deployer
from dgxmm.records.deployment import HOLDS_MEMORY, Deployment, Mode, RuntimeHandle, State
from dgxmm.deploy.reconcile import reconcile
from dgxmm.events import EventBus
from dgxmm.settings import DeployerSettings, MemorySettings
from dgxmm.store.db import Store


class LeftEngines:
    """Engines an earlier dgxmm left running: which answer health, which list their model."""

    def __init__(self) -> None:
        self.healthy: set[str] = set()
        self.listing: set[str] = set()
        self.url = ""

    async def start(self) -> web.AppRunner:
        async def health(request: web.Request) -> web.Response:
            return web.json_response({}, status=200 if request.match_info["id"] in self.healthy else 503)

        async def models(request: web.Request) -> web.Response:
            name = request.match_info["id"]
            return web.json_response({"data": [{"id": name}] if name in self.listing else []})

        app = web.Application()
        app.router.add_get("/e/{id}/health", health)
        app.router.add_get("/e/{id}/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/e/"
        return runner

    def handle(self, dep_id: str) -> RuntimeHandle:
        return RuntimeHandle(ref=f"left-{dep_id}", base_url=self.url + dep_id)


class LeftRuntime(FakeRuntime):
    def __init__(self, engines: LeftEngines) -> None:
        super().__init__()
        self.engines = engines
        self.left: set[str] = set()

    async def adopt(self, dep: Deployment) -> RuntimeHandle | None:
        if dep.id not in self.left:
            return None
        self.running[dep.id] = asyncio.get_running_loop().create_future()  # runs until stopped
        return self.engines.handle(dep.id)


@pytest.fixture
async def engines() -> AsyncIterator[LeftEngines]:
    engines = LeftEngines()
    runner = await engines.start()
    yield engines
    await runner.cleanup()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "db.sqlite")


@pytest.fixture
async def restart(store: Store, engines: LeftEngines):
    """Store records as a killed dgxmm left them, then start a deployer on them and reconcile."""
    made: list[Deployer] = []

    async def run(records: list[Deployment], left: set[str]) -> Deployer:
        for dep in records:
            store.put(dep, keep=False)
        runtime = LeftRuntime(engines)
        runtime.left = left
        d_bus = EventBus(store)
        d = Deployer(
            DeployerSettings(start_timeout_s=0.2, start_poll_s=0.01),
            store,
            d_bus,
            MemoryBudget(MemorySettings(capacity_gib=10)),
            runtime,
            http,
        )
        made.append(d)
        await reconcile(d, http, d_bus)
        return d

    async with aiohttp.ClientSession() as http:
        yield run
        for d in made:
            await d.close()


def record(dep_id: str, state: State, mode: Mode = Mode.ON_DEMAND) -> Deployment:
    return Deployment(
        id=dep_id,
        name=dep_id,
        served_name=dep_id,
        engine="command",
        command=["x"],
        memory_gib=1,
        mode=mode,
        state=state,
        runtime_handle=RuntimeHandle(ref="old", base_url="x"),
    )


def events(store: Store, dep_id: str) -> list[str]:
    return [e["text"] for e in store.list_events(50, dep_id)]


async def test_a_starting_engine_that_serves_is_adopted_as_ready(restart, engines: LeftEngines, store) -> None:
    engines.healthy, engines.listing = {"a"}, {"a"}
    d = await restart([record("a", State.STARTING)], left={"a"})
    dep = d.get("a")
    assert dep.state is State.READY and dep.runtime_handle == engines.handle("a")
    assert d.runtime.stopped == []
    assert "Adopted the running engine" in events(store, "a")
    assert d.snapshot().held == 1


@pytest.mark.parametrize(("healthy", "listing"), [(False, False), (True, False)])
async def test_a_starting_engine_not_serving_yet_is_removed(restart, engines, store, healthy, listing) -> None:
    engines.healthy, engines.listing = {"a"} if healthy else set(), {"a"} if listing else set()
    d = await restart([record("a", State.STARTING)], left={"a"})
    assert d.get("a").state is State.STOPPED
    assert d.runtime.stopped == ["a"]
    assert "Removed the engine an earlier dgxmm left (starting)" in events(store, "a")


async def test_an_always_on_starting_engine_not_serving_is_replaced(restart, engines: LeftEngines) -> None:
    d = await restart([record("a", State.STARTING, Mode.ALWAYS_ON)], left={"a"})
    assert d.runtime.stopped == ["a"]
    assert d.get("a").state in HOLDS_MEMORY  # started again, counted
    await d.starting_task("a")
    assert d.runtime.started == ["a"]


async def test_a_ready_engine_must_still_list_its_model(restart, engines: LeftEngines) -> None:
    engines.healthy, engines.listing = {"a", "b"}, {"a"}
    d = await restart([record("a", State.READY), record("b", State.READY)], left={"a", "b"})
    assert d.get("a").state is State.READY
    assert d.get("b").state is State.STOPPED
    assert d.runtime.stopped == ["b"]


async def test_an_asleep_engine_that_answers_health_stays_asleep(restart, engines: LeftEngines) -> None:
    engines.healthy = {"a"}
    d = await restart([record("a", State.ASLEEP)], left={"a"})
    assert d.get("a").state is State.ASLEEP and d.runtime.stopped == []


@pytest.mark.parametrize("mode", [Mode.ON_DEMAND, Mode.ALWAYS_ON])
async def test_a_stop_under_way_is_finished_and_not_undone(restart, engines: LeftEngines, mode: Mode) -> None:
    """Killed while stopping (by hand, the reaper or a make-room stop): the engine goes, and an
    always-on deployment is not started again: someone wanted it stopped."""
    engines.healthy, engines.listing = {"a"}, {"a"}
    d = await restart([record("a", State.STOPPING, mode)], left={"a"})
    assert d.get("a").state is State.STOPPED
    assert d.runtime.stopped == ["a"] and d.runtime.started == []


@pytest.mark.parametrize("state", [State.STOPPED, State.FAILED, State.PLANNED])
async def test_an_engine_behind_a_deployment_holding_nothing_is_removed(restart, engines, state) -> None:
    engines.healthy, engines.listing = {"a"}, {"a"}
    d = await restart([record("a", state, Mode.ALWAYS_ON)], left={"a"})
    assert d.get("a").state is state
    assert d.runtime.stopped == ["a"] and d.runtime.started == []
    assert d.snapshot().held == 0


async def test_without_an_engine_running_states_become_stopped(restart) -> None:
    d = await restart([record("a", State.STARTING), record("b", State.READY), record("c", State.STOPPING)], left=set())
    assert [d.get(x).state for x in "abc"] == [State.STOPPED] * 3
    assert d.runtime.stopped == []
