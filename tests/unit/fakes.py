"""In-memory doubles for fast deployer tests: a runtime whose engines are controllable futures,
and a model store whose files the test makes arrive."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from dgxmm.deploy.engines import EngineKind
from dgxmm.errors import InvalidInput
from dgxmm.records.deployment import Deployment, RuntimeHandle
from dgxmm.deploy.runtimes.base import Runtime


class FakeRuntime(Runtime):
    """Engines that never answer HTTP; tests drive exits and observe starts and stops."""

    name = "fake"

    def __init__(self) -> None:
        self.started: list[str] = []
        self.launched: dict[str, Deployment] = {}  # the record each engine was launched with, last
        self.stopped: list[str] = []
        self.running: dict[str, asyncio.Future[str]] = {}
        self.stop_gate: asyncio.Event | None = None

    async def start(self, dep: Deployment, kind: EngineKind) -> RuntimeHandle:
        self.started.append(dep.id)
        self.launched[dep.id] = dep
        self.running[dep.id] = asyncio.get_running_loop().create_future()
        return RuntimeHandle(ref=dep.id, base_url="http://127.0.0.1:9")

    async def stop(self, deployment_id: str, grace_s: float) -> None:
        if self.stop_gate is not None:
            await self.stop_gate.wait()
        self.stopped.append(deployment_id)
        fut = self.running.pop(deployment_id, None)
        if fut is not None and not fut.done():
            fut.set_result("stopped")

    async def wait_exit(self, deployment_id: str) -> str:
        fut = self.running.get(deployment_id)
        return "not running" if fut is None else await asyncio.shield(fut)

    def exit_reason(self, deployment_id: str) -> str | None:
        fut = self.running.get(deployment_id)
        return "not running" if fut is None else (fut.result() if fut.done() else None)

    async def logs(self, deployment_id: str, tail: int) -> list[str]:
        return ["fake log line"]

    async def adopt(self, dep: Deployment) -> RuntimeHandle | None:
        return None

    async def close(self) -> None:
        self.stop_gate = None
        for dep_id in list(self.running):
            await self.stop(dep_id, 0)


@dataclass(frozen=True)
class FileState:
    """What the fake model store says of a model's files (deploy/preparation.py's ``Files``)."""

    path: str | None = None
    downloading: bool = False
    reason: str = ""


class FakeModelFiles:
    """A model store the test drives (``ModelFiles``): a fetch marks the model downloading (or
    refuses it, ``refuse``); ``arrive``, ``progress`` and ``fail`` change what it says, and tell
    the listeners as the store does."""

    def __init__(self) -> None:
        self.states: dict[str, FileState] = {}
        self.fetched: list[str] = []
        self.refuse: dict[str, str] = {}  # model -> the InvalidInput message of its fetch
        self.listeners: list[Callable[[], None]] = []

    def readiness_of(self, model: str) -> FileState:
        return self.states.get(model, FileState(reason=f"{model} is not pulled yet"))

    async def fetch(self, model: str, user: str | None) -> None:
        self.fetched.append(model)
        if model in self.refuse:
            raise InvalidInput(self.refuse[model], field="model")
        if self.readiness_of(model).path is None:
            self.set(model, FileState(downloading=True, reason="downloading 0.0 of 1.0 GiB"))

    def add_listener(self, listener: Callable[[], None]) -> None:
        self.listeners.append(listener)

    def set(self, model: str, state: FileState) -> None:
        self.states[model] = state
        for listener in self.listeners:
            listener()

    def progress(self, model: str, reason: str) -> None:
        self.set(model, FileState(downloading=True, reason=reason))

    def arrive(self, model: str, path: str) -> None:
        self.set(model, FileState(path=path))

    def fail(self, model: str, reason: str) -> None:
        self.set(model, FileState(reason=reason))
