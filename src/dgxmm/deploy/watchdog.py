"""The watchdog: one supervised task per ready (or asleep) engine that notices it exited or hung.

An exit is noticed at once (the runtime's ``wait_exit``). A hung engine is one whose health
probe, every ``health_interval_s``, failed ``health_failures`` times in a row while it showed no
other sign of life (``liveness``: bytes of an answer, a metrics page): a busy engine whose health
check is slow is never taken for a hung one. Either way the deployer marks the deployment failed
with the reason and the engine's last log lines, ends its requests and stops its engine.

The tasks run under the supervisor: one that raises is logged, recorded and restarted, and starts
over by looking at the engine again. If the runtime cannot say when the engine exits
(``wait_exit`` raised), the health probes alone decide, so a dead engine still leaves ``ready``
within ``health_interval_s`` x ``health_failures``.

It sees the deployer only through narrow callables (read a record, wait for an engine's exit,
mark failed, the signs of life), so it cannot reach anything else of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any

import aiohttp

from dgxmm.deploy import probe
from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.liveness import HangCheck
from dgxmm.records.deployment import Deployment, State
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
        signs: Callable[[str], Hashable] = lambda deployment_id: (),
    ) -> None:
        self._settings = settings
        self._signs = signs
        self._find = find
        self._wait_exit = wait_exit
        self._fail = fail
        self._http = http
        self._supervisor = supervisor
        self._watched: set[str] = set()

    def watch(self, deployment_id: str) -> None:
        self._watched.add(deployment_id)
        self._supervisor.start(task_name(deployment_id), lambda: self._run(deployment_id), deployment_id=deployment_id)

    def unwatch(self, deployment_id: str) -> None:
        self._watched.discard(deployment_id)
        self._supervisor.stop(task_name(deployment_id))

    def close(self) -> None:
        for deployment_id in list(self._watched):
            self.unwatch(deployment_id)

    async def _run(self, deployment_id: str) -> None:
        settings = self._settings
        exited: asyncio.Task[str] | None = asyncio.create_task(self._wait_exit(deployment_id))
        check = HangCheck(settings.health_failures, self._signs(deployment_id))
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
                    log.warning(
                        "cannot wait for the engine of %s to exit (%r): health probes decide",
                        deployment_id,
                        exited.exception(),
                    )
                    exited = None
                    continue
                timeout = min(5.0, settings.health_interval_s)
                healthy = bool(dep.base_url) and await probe.healthy(
                    self._http,
                    dep.base_url or "",
                    engine_of(dep).health_path_of(dep),
                    timeout,
                    dep.runtime_handle.auth if dep.runtime_handle else None,
                )
                if check.observe(healthy, self._signs(deployment_id)):
                    await self._fail(
                        deployment_id,
                        f"health check failed {check.failures} times in a row, "
                        "with no other sign of life: the engine hung",
                    )
                    return
        finally:
            if exited is not None:
                exited.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await exited
