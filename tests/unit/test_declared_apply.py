"""Applying declarations through a real deployer on a fake runtime (dgxmm.declared.apply): what
is created, changed, restarted and removed, and when: never a busy engine, never half a change."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from unit.fakes import FakeRuntime

from dgxmm.declared.apply import Applier
from dgxmm.declared.parse import Declaration, Sources, read
from dgxmm.declared.plan import declared_id
from dgxmm.deploy.budget import MemoryBudget
from dgxmm.deploy.deployer import Deployer
from dgxmm.events import EventBus
from dgxmm.records.deployment import Deployment, Mode, State
from dgxmm.settings import DeployerSettings, MemorySettings
from dgxmm.store.db import Store


class Host:
    """The applier's world: a deployer, and what the controller would say and do."""

    def __init__(self, deployer: Deployer, store: Store) -> None:
        self.deployer, self.store = deployer, store
        self.busy: set[str] = set()
        self.modes: list[tuple[str, Mode, float | None]] = []
        self.preloaded: list[str] = []
        self.applier = Applier(deployer, busy=self.busy.__contains__, set_mode=self.set_mode, preload=self.preload)

    async def set_mode(self, deployment_id: str, mode: Mode, idle: float | None) -> None:
        self.modes.append((deployment_id, mode, idle))
        self.deployer.switch_mode(deployment_id, mode, idle)

    def preload(self, ids: list[str]) -> None:
        self.preloaded += ids

    def ready(self, name: str) -> str:
        dep_id = declared_id(name)
        self.deployer._ledger.mark_starting(dep_id, None)
        self.deployer._ledger.mark_ready(dep_id)
        return dep_id

    def state(self, name: str) -> State:
        return self.deployer.get(declared_id(name)).state


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    store = Store(tmp_path / "db.sqlite")
    async with aiohttp.ClientSession() as http:
        deployer = Deployer(
            DeployerSettings(start_timeout_s=30, start_poll_s=0.01),
            store,
            EventBus(store),
            MemoryBudget(MemorySettings(capacity_gib=1000)),
            FakeRuntime(),
            http,
        )
        yield Host(deployer, store)
        await deployer.close()


def decls(*tables: dict[str, Any]) -> list[Declaration]:
    base = {"engine": "command", "command": ["x"], "memory_gib": 4, "mode": "on_demand"}
    return list(read(Sources(None, None, tuple(base | t for t in tables))))


async def test_created_declared_with_their_file_and_stable_ids(host: Host) -> None:
    done = await host.applier.apply(decls({"name": "a"}, {"name": "b", "preload": True}))
    assert [c.declaration.name for c in done.created] == ["a", "b"]
    a = host.deployer.get(declared_id("a"))
    assert (a.managed_by, a.declared_in, a.state, a.served_name) == ("config", "config", State.STOPPED, "a")
    assert host.preloaded == [declared_id("b")]  # an on-demand one waits for its first request, or a preload
    assert host.deployer.runtime.started == []  # type: ignore[attr-defined]
    assert (await host.applier.apply(decls({"name": "a"}, {"name": "b", "preload": True}))).empty


async def test_an_always_on_one_starts_when_created(host: Host) -> None:
    await host.applier.apply(decls({"name": "a", "mode": "always_on"}))
    assert host.state("a") is State.STARTING


async def test_a_hundred_unchanged_declarations_write_nothing_and_restart_nothing(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = decls(*({"name": f"m{i}", "aliases": [f"x{i}"]} for i in range(100)))
    await host.applier.apply(many)
    for i in range(0, 100, 2):
        host.ready(f"m{i}")
    writes: list[str] = []
    put = host.store.put
    monkeypatch.setattr(host.store, "put", lambda dep, *, keep: writes.append(dep.id) or put(dep, keep=keep))
    heard: list[str] = []
    host.deployer.add_listener(lambda change: heard.append(change.kind))
    again = await host.applier.apply(decls(*({"name": f"m{i}", "aliases": [f"x{i}"]} for i in range(100))))
    assert again.empty and again.unchanged == 100
    assert writes == [] and heard == [] and host.deployer.runtime.stopped == []  # type: ignore[attr-defined]


async def test_an_engine_change_waits_for_the_requests_in_flight(host: Host) -> None:
    await host.applier.apply(decls({"name": "a"}))
    dep_id = host.ready("a")
    host.busy.add(dep_id)
    first = await host.applier.apply(decls({"name": "a", "memory_gib": 6}))
    assert first.restarted == ("a",) and host.state("a") is State.READY
    assert host.deployer.get(dep_id).memory_gib == 4  # nothing half-changed
    host.busy.clear()
    await host.applier.apply(decls({"name": "a", "memory_gib": 6}))
    dep = host.deployer.get(dep_id)
    assert (dep.state, dep.memory_gib, dep.id) == (State.STOPPED, 6, dep_id)  # on demand: its next request starts it
    assert (await host.applier.apply(decls({"name": "a", "memory_gib": 6}))).empty


async def test_an_always_on_one_is_started_again_with_its_new_settings(host: Host) -> None:
    await host.applier.apply(decls({"name": "a", "mode": "always_on"}))
    host.deployer._ledger.mark_ready(declared_id("a"))
    await host.applier.apply(decls({"name": "a", "mode": "always_on", "args": ["--new"]}))
    dep = host.deployer.get(declared_id("a"))
    assert (dep.state, dep.args) == (State.STARTING, ["--new"])
    assert host.deployer.runtime.stopped == [dep.id]  # type: ignore[attr-defined]


async def test_a_starting_engine_is_changed_once_it_settled(host: Host) -> None:
    await host.applier.apply(decls({"name": "a"}))
    host.deployer._ledger.mark_starting(declared_id("a"), None)
    await host.applier.apply(decls({"name": "a", "memory_gib": 6}))
    assert host.state("a") is State.STARTING and host.deployer.get(declared_id("a")).memory_gib == 4
    host.deployer._ledger.mark_ready(declared_id("a"))
    await host.applier.apply(decls({"name": "a", "memory_gib": 6}))
    assert host.state("a") is State.STOPPED and host.deployer.get(declared_id("a")).memory_gib == 6


async def test_names_preload_and_mode_change_while_it_runs(host: Host) -> None:
    await host.applier.apply(decls({"name": "a"}))
    dep_id = host.ready("a")
    host.busy.add(dep_id)
    await host.applier.apply(decls({"name": "a", "aliases": ["b"], "preload": True, "idle_timeout_s": 120}))
    dep = host.deployer.get(dep_id)
    assert (dep.state, dep.aliases, dep.preload, dep.idle_timeout_s) == (State.READY, ["b"], True, 120)
    assert host.modes == [(dep_id, Mode.ON_DEMAND, 120)]


async def test_a_removed_one_is_stopped_once_its_requests_end(host: Host) -> None:
    await host.applier.apply(decls({"name": "a"}, {"name": "gone"}))
    dep_id = host.ready("gone")
    host.busy.add(dep_id)
    await host.applier.apply(decls({"name": "a"}))
    assert host.state("gone") is State.READY
    host.busy.clear()
    await host.applier.apply(decls({"name": "a"}))
    assert host.deployer.find(dep_id) is None and host.deployer.find(declared_id("a")) is not None


async def test_a_deployment_made_through_the_api_is_never_touched(host: Host) -> None:
    made = Deployment(id="api1", name="made", served_name="made", engine="command", command=["x"], memory_gib=1)
    host.deployer.create(made, user=None, start=False)
    await host.applier.apply(decls({"name": "a"}))
    await host.applier.apply([])
    assert [d.name for d in host.deployer.all()] == ["made"]
