"""The one-thread rule (dgxmm/onethread.py): every route handler and dependency runs on the event
loop's thread, and the owners of dgxmm's state refuse a change from any other thread."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import make_settings
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import Route
from unit.fake_effects import FakeEffects
from unit.fakes import FakeRuntime

from dgxmm.app import create_app
from dgxmm.deploy.budget import MemoryBudget
from dgxmm.deploy.deployer import Deployer
from dgxmm.records.deployment import Deployment, State
from dgxmm.events import EventBus
from dgxmm.controller.controller import Controller
from dgxmm.onethread import OffLoopThread
from dgxmm.settings import DeployerSettings, MemorySettings, OndemandSettings
from dgxmm.store.db import Store


def _runs_on_the_loop(call: Callable[..., Any]) -> bool:
    """Whether FastAPI awaits ``call`` on the loop (a coroutine function or an async generator)
    rather than handing it to its thread pool, as it does with a plain function."""
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for dep in dependant.dependencies:
        if dep.call is not None:
            yield dep.call
        yield from _calls(dep)


def _routes(routes: list[Any]) -> Iterator[Route]:
    """Every route, those of included routers too (FastAPI includes a router as one entry that
    keeps the router it came from)."""
    for route in routes:
        if isinstance(route, Route):
            yield route
        elif hasattr(route, "original_router"):
            yield from _routes(route.original_router.routes)


def test_every_route_handler_and_dependency_is_async(tmp_path: Path) -> None:
    """A plain ``def`` handler runs in a worker thread, off the loop that owns the state. The
    whole app is checked, FastAPI's own routes (schema, docs page) included."""
    app = create_app(make_settings(tmp_path)).api
    plain = []
    routes = list(_routes(app.routes))
    checked = {(path.rsplit("/api", 1)[-1], method) for r in routes for method in r.methods or () for path in [r.path]}
    in_schema = {
        (path.rsplit("/api", 1)[-1], method.upper()) for path, item in app.openapi()["paths"].items() for method in item
    }
    assert in_schema and in_schema <= checked, "a route of the API was not looked at"
    for route in routes:
        calls = [route.endpoint]
        if isinstance(route, APIRoute):
            calls += list(_calls(route.dependant))
        plain += [f"{route.path} {call.__qualname__}" for call in calls if not _runs_on_the_loop(call)]
    assert plain == []


def test_a_plain_handler_is_found(tmp_path: Path) -> None:
    """The check above sees a plain handler and a plain dependency (so it can fail)."""
    app = create_app(make_settings(tmp_path)).api

    def plain_dependency() -> int:
        return 1

    from fastapi import Depends

    @app.get("/plain")
    def plain_handler(value: int = Depends(plain_dependency)) -> int:
        return value

    route = next(r for r in app.routes if isinstance(r, APIRoute) and r.path == "/plain")
    assert not _runs_on_the_loop(route.endpoint)
    assert [c for c in _calls(route.dependant) if not _runs_on_the_loop(c)] == [plain_dependency]


def _in_a_thread(fn: Callable[[], Any]) -> BaseException | None:
    """Run ``fn`` in another thread; the exception it raised, if any."""
    import threading

    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None


async def test_the_deployer_refuses_changes_from_another_thread(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    async with aiohttp.ClientSession() as http:
        deployer = Deployer(
            DeployerSettings(),
            store,
            EventBus(store),
            MemoryBudget(MemorySettings(capacity_gib=10)),
            FakeRuntime(),
            http,
        )
        deployer.create(
            Deployment(id="a", name="a", served_name="a", engine="command", command=["x"], memory_gib=1),
            user=None,
            start=False,
        )
        error = _in_a_thread(lambda: deployer._ledger.edit("a", {"idle_timeout_s": 120}))
        assert isinstance(error, OffLoopThread) and "deployer" in str(error)
        assert deployer.get("a").idle_timeout_s is None  # nothing was written
        deployer._ledger.edit("a", {"idle_timeout_s": 120})  # on its own thread it goes through
        assert deployer.get("a").idle_timeout_s == 120
        await deployer.close()
    store.close()


async def test_the_controller_refuses_a_slot_from_another_thread() -> None:
    effects = FakeEffects(capacity=10)
    effects.add("a", 1, state=State.READY)
    controller = Controller(OndemandSettings(), effects, lambda _id: None)
    error = _in_a_thread(lambda: controller.try_slot("a"))
    assert isinstance(error, OffLoopThread) and "controller" in str(error)
    assert controller.status("a")["inflight"] == 0
    slot = controller.try_slot("a")
    assert slot is not None and controller.status("a")["inflight"] == 1
    slot.release()
    error = _in_a_thread(controller.notify)
    assert isinstance(error, OffLoopThread)
    controller.close()
    await asyncio.sleep(0)


def test_the_store_refuses_another_thread(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    error = _in_a_thread(lambda: store.add_event(0.0, "api", None, "from a thread"))
    assert isinstance(error, sqlite3.ProgrammingError)
    assert store.list_events(10) == []
    store.close()


@pytest.mark.parametrize("path", ["src/dgxmm/api/deployments.py", "src/dgxmm/api/host.py"])
def test_no_plain_def_handler_in_the_source(path: str) -> None:
    """The same rule read from the source (as the project's stop check reads it): a decorated
    route function is ``async def``."""
    import ast

    tree = ast.parse((Path(__file__).resolve().parents[2] / path).read_text())
    plain = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) for d in node.decorator_list)
    ]
    assert plain == []
