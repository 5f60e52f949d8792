"""The watchdog: one task per ready (or asleep) engine that notices it exited or stopped answering.

An exit is noticed at once (the runtime's ``wait_exit``); a hung engine after ``health_failures``
failed health probes in a row, ``health_interval_s`` apart. Either way the deployer marks the
deployment failed with the reason and the engine's last log lines, and frees its memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import aiohttp

from dgxmm.deploy import probe
from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.models import State

if TYPE_CHECKING:
    from dgxmm.deploy.deployer import Deployer

WATCHED = (State.READY, State.ASLEEP)


class Watchdog:
    def __init__(self, deployer: Deployer, http: aiohttp.ClientSession) -> None:
        self._deployer = deployer
        self._http = http
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def watch(self, deployment_id: str) -> None:
        self.unwatch(deployment_id)
        self._tasks[deployment_id] = asyncio.create_task(
            self._run(deployment_id), name=f"watchdog-{deployment_id}"
        )

    def unwatch(self, deployment_id: str) -> None:
        task = self._tasks.pop(deployment_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def close(self) -> None:
        for deployment_id in list(self._tasks):
            self.unwatch(deployment_id)

    async def _run(self, deployment_id: str) -> None:
        settings = self._deployer.settings
        exited = asyncio.create_task(self._deployer.runtime.wait_exit(deployment_id))
        failures = 0
        try:
            while True:
                await asyncio.wait([exited], timeout=settings.health_interval_s)
                dep = self._deployer.find(deployment_id)
                if dep is None or dep.state not in WATCHED:
                    return
                if exited.done():
                    await self._deployer.fail(deployment_id, f"engine exited ({exited.result()})")
                    return
                timeout = min(5.0, settings.health_interval_s)
                if dep.base_url and await probe.healthy(
                    self._http, dep.base_url, engine_of(dep).health_path_of(dep), timeout
                ):
                    failures = 0
                    continue
                failures += 1
                if failures >= settings.health_failures:
                    await self._deployer.fail(
                        deployment_id, f"health check failed {failures} times in a row"
                    )
                    return
        finally:
            exited.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await exited
            if self._tasks.get(deployment_id) is asyncio.current_task():
                del self._tasks[deployment_id]
