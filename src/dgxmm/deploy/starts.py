"""How an engine start or wake runs, and how it ends: ready, or failed with its log tail.

The deployer's transitions (``restart``, ``wake``) check and write in one plain call and then hand
the slow part to a task running these methods: wait at the start-up gate, launch, probe until the
engine serves (``readiness``), then mark it ready, or failed with the reason and the engine's last
log lines. They are a part of ``Deployer`` (this class is its base) kept in their own module so
that deployer.py reads as the records and their transitions; they use the deployer's state and
write only through its methods (``set_state``, ``update``, ``_write``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import aiohttp

from dgxmm.deploy import probe, readiness
from dgxmm.records.changes import Change
from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.limits import EngineLimits
from dgxmm.records.deployment import Deployment, RuntimeHandle, State
from dgxmm.deploy.runtimes.base import LaunchError, Runtime, current_run
from dgxmm.deploy.watchdog import Watchdog
from dgxmm.errors import InvalidInput
from dgxmm.events import EventBus
from dgxmm.settings import DeployerSettings
from dgxmm.logs import fields

log = logging.getLogger("dgxmm.deploy.deployer")

LOG_TAIL_TIMEOUT_S = 2.0  # how long marking a failure may wait for the engine's log tail


class EngineStartFailed(Exception):
    pass


class StartReport(Protocol):
    """Where the deployer reports its engines' load times (dgxmm's metrics implement it)."""

    def launched(self, deployment_id: str, seconds: float) -> None:
        """An engine became ready ``seconds`` after its launch (after the start-up gate)."""


class Unreported:
    """The report of a deployer built without one (tests): nothing is kept."""

    def launched(self, deployment_id: str, seconds: float) -> None:
        pass


class EngineRuns:
    """The start and wake tasks of ``Deployer`` (its base class; see the module docstring)."""

    settings: DeployerSettings
    runtime: Runtime
    limits: EngineLimits | None
    report: StartReport
    _bus: EventBus
    _http: aiohttp.ClientSession
    _deps: dict[str, Deployment]
    _gate: asyncio.Semaphore
    _gated: set[str]
    _ending: set[str]
    _watchdog: Watchdog
    _require: Callable[[str], Deployment]
    _write: Callable[[Deployment], None]
    set_state: Callable[..., Deployment]
    _notify: Callable[[Change], None]
    update: Callable[..., Deployment]

    async def _run_start(self, deployment_id: str) -> None:
        try:
            if self._gate.locked():
                self._gated.add(deployment_id)
                self._bus.event("deployer", deployment_id, "Waiting for another engine to load")
            async with self._gate:
                self._gated.discard(deployment_id)
                started = time.monotonic()  # the start timeout counts from the launch, not the gate
                dep = self._with_limit(deployment_id)
                handle = await self.runtime.start(dep, engine_of(dep))
                self._deps[deployment_id] = self._deps[deployment_id].model_copy(
                    update={"runtime_handle": handle}
                )
                self._write(self._deps[deployment_id])
                await self._wait_serving(deployment_id, handle, started)
                loaded = time.monotonic() - started
        except (LaunchError, EngineStartFailed) as exc:
            await self._fail(deployment_id, str(exc), from_states=(State.STARTING,))
            return
        except Exception as exc:  # a bug must not leave it starting (and holding memory) forever
            log.exception("start of %s failed", deployment_id, extra=fields(deployment_id))
            await self._fail(deployment_id, f"start failed: {type(exc).__name__}: {exc}",
                             from_states=(State.STARTING,))  # fmt: skip
            return
        finally:
            self._gated.discard(deployment_id)  # also when cancelled at the gate
        if self._become_ready(deployment_id, started):
            self.report.launched(deployment_id, loaded)

    def _with_limit(self, deployment_id: str) -> Deployment:
        """The record to launch, its memory limit worked out again: the model's files or the
        device total may have changed since the last start."""
        dep = self._require(deployment_id)
        if self.limits is None:
            return dep
        try:
            limit = self.limits.resolve(dep)
        except InvalidInput as exc:
            raise EngineStartFailed(exc.message) from None
        if limit != dep.memory_limit:
            return self.update(deployment_id, memory_limit=limit)
        return dep.model_copy()

    async def _run_wake(self, deployment_id: str) -> None:
        started = time.monotonic()
        dep = self._require(deployment_id)
        handle = dep.runtime_handle
        try:
            if handle is None:
                raise EngineStartFailed("no engine to wake")
            await self._wake_engine(handle)
            await self._wait_serving(deployment_id, handle, started, woken=True)
        except EngineStartFailed as exc:
            await self._fail(deployment_id, str(exc), from_states=(State.STARTING,))
            return
        self._become_ready(deployment_id, started)

    async def _wake_engine(self, handle: RuntimeHandle) -> None:
        problem = await probe.post(self._http, handle.base_url + "/wake_up")
        if problem:
            raise EngineStartFailed(f"wake_up refused: {problem}")

    def _become_ready(self, deployment_id: str, started: float) -> bool:
        if self._require(deployment_id).state is not State.STARTING:
            return False
        self.set_state(deployment_id, State.READY)
        self._watchdog.watch(deployment_id)
        self._bus.event("deployer", deployment_id, f"Ready after {time.monotonic() - started:.1f} s")
        return True

    async def _wait_serving(
        self, deployment_id: str, handle: RuntimeHandle, started: float, *, woken: bool = False
    ) -> None:
        """Probe until the engine is healthy and lists its model, soon after launch and at once
        when it writes something (``readiness``); EngineStartFailed on exit or timeout."""
        dep = self._require(deployment_id)
        path = engine_of(dep).health_path_of(dep)

        async def serving() -> bool:
            return await probe.healthy(self._http, handle.base_url, path) and await probe.lists_model(
                self._http, handle.base_url, dep.served_name
            )

        def check_exit() -> None:
            ended = self.runtime.exit_reason(deployment_id)
            if ended is not None:
                raise EngineStartFailed(f"engine exited during start-up ({ended})")

        if not await readiness.wait_ready(
            serving, lambda: self.runtime.output_size(deployment_id), check_exit,
            max_interval_s=self.settings.start_poll_s, deadline=started + self.settings.start_timeout_s,
            first_at_once=woken,
        ):  # fmt: skip
            raise EngineStartFailed(f"not ready after {self.settings.start_timeout_s:g} s")

    async def _fail(
        self, deployment_id: str, reason: str, *, from_states: tuple[State, ...]
    ) -> None:
        """Mark failed with the reason and the engine's last log lines (of this run only: the
        reason must not grow with every attempt), then free its memory. Nothing that may fail
        comes before the mark (see the module's contracts)."""
        tail = current_run(await self._log_tail(deployment_id))
        dep = self._deps.get(deployment_id)
        if dep is None or dep.state not in from_states:
            return
        full = reason + ("\n" + "\n".join(tail) if tail else "")
        self._watchdog.unwatch(deployment_id)
        self._ending.add(deployment_id)  # its memory is counted until its engine is gone
        try:
            self.set_state(deployment_id, State.FAILED, full)
            try:
                self._bus.event("deployer", deployment_id, f"Failed: {reason}")
            except Exception:
                log.exception("cannot record the failure of %s as an event", deployment_id)
            try:
                await self.runtime.stop(deployment_id, self.settings.stop_grace_s)
            except Exception:
                log.exception("cannot stop the failed engine of %s", deployment_id)
        finally:
            self._ending.discard(deployment_id)
            if deployment_id in self._deps:
                self._notify(Change("released", self._deps[deployment_id].model_copy()))

    async def _log_tail(self, deployment_id: str) -> list[str]:
        """The engine's last log lines, or one line saying why they cannot be read."""
        try:
            async with asyncio.timeout(LOG_TAIL_TIMEOUT_S):
                return await self.runtime.logs(deployment_id, self.settings.log_tail_lines)
        except Exception as exc:  # noqa: BLE001 - a log read must never stop the marking
            log.warning("cannot read the log of %s: %r", deployment_id, exc)
            return [f"(the engine's log cannot be read: {type(exc).__name__}: {exc})"]
