"""Deployer contracts with an in-memory runtime: precheck, pending mode, listeners, fit check."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from unit.fakes import FakeRuntime

from dgxmm.deploy.budget import InsufficientMemory, MemoryBudget
from dgxmm.records.changes import Change
from dgxmm.deploy.deployer import Deployer
from dgxmm.deploy.edits import Edits
from dgxmm.deploy.ledger import Ledger
from dgxmm.deploy.limits import EngineLimits
from dgxmm.records.deployment import Deployment, Mode, State
from dgxmm.errors import Conflict, InvalidInput, StoreUnavailable
from dgxmm.events import EventBus
from dgxmm.settings import DeployerSettings, EngineSettings, MemorySettings
from dgxmm.store.db import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "db.sqlite")


@pytest.fixture
async def deployer(store: Store) -> AsyncIterator[Deployer]:
    async with aiohttp.ClientSession() as http:
        d = Deployer(
            DeployerSettings(start_timeout_s=0.2, start_poll_s=0.01),
            store,
            EventBus(store),
            MemoryBudget(MemorySettings(capacity_gib=10)),
            FakeRuntime(),
            http,
        )
        yield d
        await d.close()


def new(name: str, gib: float = 4, **kw: object) -> Deployment:
    return Deployment(id=name, name=name, served_name=name, engine="command", command=["x"], memory_gib=gib, **kw)


async def ready(deployer: Deployer, name: str, gib: float = 4, **kw: object) -> str:
    """A deployment in state ready without an engine answering HTTP (set through the API the
    watchdog uses, so only the precheck/stop logic is under test)."""
    deployer.create(new(name, gib, **kw), user=None, start=False)
    deployer._ledger.mark_starting(name, None)
    deployer._ledger.mark_ready(name)
    return name


async def test_refused_precheck_changes_nothing(deployer: Deployer) -> None:
    await ready(deployer, "a")
    seen: list[State] = []
    ok = await deployer.stop("a", lambda dep: seen.append(dep.state) or False, actor="ondemand")
    assert ok is False and seen == [State.READY]
    assert deployer.get("a").state is State.READY
    assert deployer.runtime.stopped == []  # type: ignore[attr-defined]


async def test_approved_precheck_marks_stopping_before_any_await(deployer: Deployer) -> None:
    """The precheck and the mark 'stopping' happen in one step: code running on the loop right
    after the stop began (e.g. a slot being granted) already sees 'stopping'."""
    await ready(deployer, "a")
    runtime: FakeRuntime = deployer.runtime  # type: ignore[assignment]
    runtime.stop_gate = asyncio.Event()
    stop = asyncio.create_task(deployer.stop("a", lambda dep: True, actor="ondemand"))
    while deployer.get("a").state is State.READY:
        await asyncio.sleep(0)
    assert deployer.get("a").state is State.STOPPING
    assert not stop.done()
    runtime.stop_gate.set()
    assert await stop is True
    assert deployer.get("a").state is State.STOPPED


def test_check_and_write_transitions_cannot_await() -> None:
    """The transitions that must be atomic are plain methods: no await can sneak in between
    their check and their write (that is what makes the stop precheck and a grant exclusive)."""
    for name in (
        "create",
        "restart",
        "wake",
        "reconfigure",
        "_begin_stop",
        "_begin_sleep",
        "_begin_remove",
    ):
        assert not inspect.iscoroutinefunction(getattr(Deployer, name)), name
    for name in ("reconfigure", "reset_after_edit"):
        assert not inspect.iscoroutinefunction(getattr(Edits, name)), name  # the operator's edits (deploy/edits.py)
    writes = [name for name, _ in inspect.getmembers(Ledger, inspect.isfunction) if not name.startswith("__")]
    assert {"mark_ready", "declare_stopped", "set_model_path", "_move", "_write"} <= set(writes)
    for name in writes:  # the named writes themselves (deploy/ledger.py)
        assert not inspect.iscoroutinefunction(getattr(Ledger, name)), name


async def test_a_second_start_of_a_starting_deployment_is_refused(deployer: Deployer) -> None:
    """A start while one runs changes nothing and launches no second engine."""
    deployer.create(new("a"), user=None, start=False)
    deployer.restart("a", actor="api")
    with pytest.raises(Conflict, match="is starting, not stopped or failed"):
        deployer.restart("a", actor="ondemand")
    await asyncio.sleep(0)
    assert deployer.runtime.started == ["a"]  # type: ignore[attr-defined]
    assert deployer.get("a").state is State.STARTING


async def test_pending_mode_applied_with_the_state_change(deployer: Deployer, store: Store) -> None:
    deployer.create(new("a", mode=Mode.ON_DEMAND), user=None, start=False)
    deployer.pend_mode("a", Mode.ALWAYS_ON, None)
    deployer._ledger.mark_starting("a", None)
    assert deployer.get("a").mode is Mode.ON_DEMAND
    changes: list[Change] = []
    deployer.add_listener(changes.append)
    deployer._ledger.mark_ready("a")
    dep = deployer.get("a")
    assert (dep.mode, dep.pending_mode) == (Mode.ALWAYS_ON, None)
    assert changes[-1].deployment.mode is Mode.ALWAYS_ON  # listeners see both at once
    stored = store.load_deployments()[0]  # (what a restart reads)
    assert (stored.mode, stored.pending_mode, stored.state) == (Mode.ALWAYS_ON, None, State.READY)


async def test_listeners_hear_every_change_in_order(deployer: Deployer) -> None:
    changes: list[tuple[str, str, State | None]] = []
    deployer.add_listener(lambda c: changes.append((c.kind, c.deployment.id, c.deployment.state)))
    deployer.create(new("a"), user=None, start=False)
    deployer._ledger.edit("a", {"idle_timeout_s": 120})
    deployer._ledger.mark_starting("a", None)
    await deployer.remove("a", actor="api")
    assert changes == [
        ("created", "a", State.STOPPED),
        ("config", "a", State.STOPPED),
        ("state", "a", State.STARTING),
        ("state", "a", State.STOPPING),
        ("state", "a", State.STOPPED),
        ("removed", "a", State.STOPPED),
    ]


async def test_fit_check_leaves_the_deployment_as_it_was(deployer: Deployer) -> None:
    await ready(deployer, "big", 8, mode=Mode.ON_DEMAND)
    deployer.create(new("b", 4), user=None, start=False)
    with pytest.raises(InsufficientMemory) as err:
        deployer.restart("b", actor="ondemand")
    assert (err.value.need, err.value.free, err.value.capacity) == (4, 2, 10)
    assert deployer.get("b").state is State.STOPPED
    # An always-on deployment holding memory lowers the capacity on-demand models can ever get.
    await ready(deployer, "fixed", 1, mode=Mode.ALWAYS_ON)
    with pytest.raises(InsufficientMemory) as err:
        deployer.restart("b", actor="ondemand")
    assert (err.value.free, err.value.capacity) == (1, 9)


async def test_start_that_never_becomes_healthy_fails_and_frees_memory(deployer: Deployer) -> None:
    deployer.create(new("a"), user=None, start=False)
    deployer.restart("a", actor="api")
    task = deployer.starting_task("a")
    assert task is not None
    await task
    dep = deployer.get("a")
    assert dep.state is State.FAILED and dep.state_reason.startswith("not ready after 0.2 s")
    assert "fake log line" in dep.state_reason
    assert deployer.runtime.stopped == ["a"]  # type: ignore[attr-defined]
    assert deployer.snapshot().held == 0


@pytest.fixture
async def limited(store: Store) -> AsyncIterator[Deployer]:
    """A deployer that resolves memory limits against a 128 GiB device."""
    budget = MemoryBudget(MemorySettings(capacity_gib=128))
    async with aiohttp.ClientSession() as http:
        d = Deployer(
            DeployerSettings(start_timeout_s=0.2, start_poll_s=0.01),
            store,
            EventBus(store),
            budget,
            FakeRuntime(),
            http,
            EngineLimits(budget.device_total, EngineSettings()),
        )
        yield d
        await d.close()


async def test_the_limit_is_stored_with_the_deployment(limited: Deployer, store: Store) -> None:
    vllm = Deployment(id="v", name="v", served_name="v", engine="vllm", model="org/m", memory_gib=32)
    created = limited.create(vllm, user=None, start=False)
    assert created.memory_limit is not None and created.memory_limit.value == "0.25"
    reloaded = store.load_deployments()  # (what a restart reads)
    assert reloaded[0].memory_limit == created.memory_limit


async def test_a_refused_limit_creates_nothing(limited: Deployer) -> None:
    vllm = Deployment(
        id="v",
        name="v",
        served_name="v",
        engine="vllm",
        model="org/m",
        memory_gib=32,
        args=["--gpu-memory-utilization", "0.5"],
    )
    with pytest.raises(InvalidInput, match="args: --gpu-memory-utilization 0.5 claims 64.00 GiB"):
        limited.create(vllm, user=None, start=True)
    assert limited.all() == [] and limited.runtime.started == []  # type: ignore[attr-defined]


async def test_a_model_that_outgrew_memory_gib_fails_its_next_start(limited: Deployer, tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    limited.create(
        Deployment(id="g", name="g", served_name="g", engine="llamacpp", model=str(gguf), memory_gib=4),
        user=None,
        start=False,
    )
    with gguf.open("wb") as f:
        f.truncate(5 * 1024**3)
    limited.restart("g", actor="api")
    task = limited.starting_task("g")
    assert task is not None
    await task
    dep = limited.get("g")
    assert dep.state is State.FAILED and "is 5.00 GiB, more than memory_gib 4 GiB" in dep.state_reason
    assert limited.runtime.started == []  # type: ignore[attr-defined]


async def test_a_failed_engine_holds_its_memory_until_it_is_gone(deployer: Deployer) -> None:
    """The record says failed at once (no slot is granted any more), but the budget counts the
    deployment's memory until the runtime's stop has finished; listeners then hear 'released'."""
    await ready(deployer, "a")
    heard: list[tuple[str, State]] = []
    deployer.add_listener(lambda change: heard.append((change.kind, change.deployment.state)))
    runtime: FakeRuntime = deployer.runtime  # type: ignore[assignment]
    runtime.stop_gate = asyncio.Event()
    failing = asyncio.create_task(deployer.fail("a", "health check failed 3 times in a row"))
    while deployer.get("a").state is not State.FAILED:
        await asyncio.sleep(0)
    assert deployer.snapshot().held == 4 and deployer.snapshot().free == 6
    with pytest.raises(InsufficientMemory):  # another 8 GiB does not fit beside the dying engine
        deployer.create(new("b", 8), user=None, start=True)
    assert ("released", State.FAILED) not in heard
    runtime.stop_gate.set()
    await failing
    assert deployer.snapshot().held == 0
    assert heard[-1] == ("released", State.FAILED)
    deployer.create(new("b", 8), user=None, start=True)  # now it fits


def unwritable(store: Store) -> None:
    """Every write fails as on a read-only file system (SQLite's own query_only)."""
    store._conn.execute("PRAGMA query_only=1")


async def test_with_an_unwritable_database_stop_stops_and_the_record_follows(deployer: Deployer, store: Store) -> None:
    await ready(deployer, "a")
    unwritable(store)
    assert await deployer.stop("a", actor="api") is True
    assert deployer.runtime.stopped == ["a"]  # type: ignore[attr-defined]
    assert deployer.get("a").state is State.STOPPED and not store.writable
    store._conn.execute("PRAGMA query_only=0")
    assert store.flush()
    assert store.load_deployments()[0].state is State.STOPPED


async def test_with_an_unwritable_database_a_dead_engine_is_still_marked_failed(
    deployer: Deployer, store: Store
) -> None:
    await ready(deployer, "a")
    unwritable(store)
    await deployer.fail("a", "the engine exited")
    assert deployer.get("a").state is State.FAILED
    assert deployer.runtime.stopped == ["a"]  # type: ignore[attr-defined]


async def test_with_an_unwritable_database_changes_asked_for_are_refused_with_nothing_done(
    deployer: Deployer, store: Store
) -> None:
    deployer.create(new("a"), user=None, start=False)
    unwritable(store)
    with pytest.raises(StoreUnavailable):
        deployer.create(new("b"), user=None, start=True)
    with pytest.raises(StoreUnavailable):
        deployer.restart("a", actor="api")
    with pytest.raises(StoreUnavailable):
        deployer.reconfigure("a", {"memory_gib": 2.0}, user=None)
    with pytest.raises(StoreUnavailable):
        await deployer.remove("a", actor="api")
    assert [(d.id, d.state, d.memory_gib) for d in deployer.all()] == [("a", State.STOPPED, 4)]
    assert deployer.runtime.started == []  # type: ignore[attr-defined]
