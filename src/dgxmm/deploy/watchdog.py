"""The watchdog: one supervised task per ready (or asleep) engine that notices it exited or
stopped answering.

An exit is noticed at once (the runtime's ``wait_exit``); a hung engine after ``health_failures``
failed health probes in a row, ``health_interval_s`` apart. Either way the deployer marks the
deployment failed with the reason and the engine's last log lines, and frees its memory.

The tasks run under the supervisor: one that raises is logged, recorded and restarted, and starts
over by looking at the engine again. If the runtime cannot say when the engine exits
(``wait_exit`` raised), the health probes alone decide, so a dead engine still leaves ``ready``
within ``health_interval_s`` x ``health_failures``.

It sees the deployer only through three narrow callables (read a record, wait for an engine's
exit, mark failed), so it cannot reach anything else of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiohttp

from dgxmm.deploy import probe
from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.models import Deployment, State
from dgxmm.settings import DeployerSettings
from dgxmm.supervisor import Supervisor

log = logging.getLogger(__name__)

WATCHED = (State.READY, State.ASLEEP)


def task_name(deployment_id: str) -> str:
    return f"watchdog-{deployment_id}"


class Watchdog:
    def __init__(
        self,
        settings: DeployerSettings,
        find: Callable[[str], Deployment | None],
        wait_exit: Callable[[str], Coroutine[Any, Any, str]],
        fail: Callable[[str, str], Awaitable[None]],
        http: aiohttp.ClientSession,
        supervisor: Supervisor,
    ) -> None:
        self._settings = settings
        self._find = find
        self._wait_exit = wait_exit
        self._fail = fail
        self._http = http
        self._supervisor = supervisor
        self._watched: set[str] = set()

    def watch(self, deployment_id: str) -> None:
        self._watched.add(deployment_id)
        self._supervisor.start(task_name(deployment_id), lambda: self._run(deployment_id),
                               deployment_id=deployment_id)  # fmt: skip

    def unwatch(self, deployment_id: str) -> None:
        self._watched.discard(deployment_id)
        self._supervisor.stop(task_name(deployment_id))

    def close(self) -> None:
        for deployment_id in list(self._watched):
            self.unwatch(deployment_id)

    async def _run(self, deployment_id: str) -> None:
        settings = self._settings
        exited: asyncio.Task[str] | None = asyncio.create_task(self._wait_exit(deployment_id))
        failures = 0
        try:
            while True:
                if exited is not None:
                    await asyncio.wait([exited], timeout=settings.health_interval_s)
                else:
                    await asyncio.sleep(settings.health_interval_s)
                dep = self._find(deployment_id)
                if dep is None or dep.state not in WATCHED:
                    return
                if exited is not None and exited.done():
                    if exited.exception() is None:
                        await self._fail(deployment_id, f"engine exited ({exited.result()})")
                        return
                    log.warning("cannot wait for the engine of %s to exit (%r): health probes decide",
                                deployment_id, exited.exception())  # fmt: skip
                    exited = None
                    continue
                timeout = min(5.0, settings.health_interval_s)
                if dep.base_url and await probe.healthy(
                    self._http, dep.base_url, engine_of(dep).health_path_of(dep), timeout
                ):
                    failures = 0
                    continue
                failures += 1
                if failures >= settings.health_failures:
                    await self._fail(
                        deployment_id, f"health check failed {failures} times in a row"
                    )
                    return
        finally:
            if exited is not None:
                exited.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await exited
