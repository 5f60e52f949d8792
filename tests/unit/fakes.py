"""In-memory doubles for fast deployer tests: a runtime whose engines are controllable futures."""

from __future__ import annotations

import asyncio

from dgxmm.deploy.engines import EngineKind
from dgxmm.records.deployment import Deployment, RuntimeHandle
from dgxmm.deploy.runtimes.base import Runtime


class FakeRuntime(Runtime):
    """Engines that never answer HTTP; tests drive exits and observe starts and stops."""

    name = "fake"

    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.running: dict[str, asyncio.Future[str]] = {}
        self.stop_gate: asyncio.Event | None = None

    async def start(self, dep: Deployment, kind: EngineKind) -> RuntimeHandle:
        self.started.append(dep.id)
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
