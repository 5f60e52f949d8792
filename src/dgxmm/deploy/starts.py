"""How an engine start or wake runs: the start-up gate, the launch, the wait until it serves.

The deployer's transitions (``restart``, ``wake``) check and write in one plain call and then hand
the slow part to ``Starts``, which runs it as a task of its own (no caller can cancel it half-way):
wait at the start-up gate, launch, wait until the engine serves (``Serving``), then mark it ready
and have it watched, or hand it to ``Ending`` (ending.py) with the reason.

``Starts`` owns the gate, the tasks and which starts wait at the gate; it changes deployment
records only through the ledger's writes its ``StartWrites`` interface names (ledger.py). Whether an engine serves is
``Serving``'s to say: ``EngineProbe`` asks the engine over HTTP on the readiness schedule
(readiness.py); the controller's tests put in one they decide themselves.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

import aiohttp

from dgxmm.deploy.auditing import EventLog
from dgxmm.deploy import probe, readiness
from dgxmm.deploy.engines import EngineKind, engine_of
from dgxmm.deploy.limits import EngineLimits
from dgxmm.deploy.pagecache import CacheCount
from dgxmm.deploy.runtimes.base import LaunchError, Runtime
from dgxmm.deploy.sleeplevels import LEVELS, WakeStep, level_of
from dgxmm.errors import InvalidInput, StoreUnavailable
from dgxmm.logs import fields
from dgxmm.records.deployment import Deployment, MemoryLimit, RuntimeHandle, State
from dgxmm.settings import DeployerSettings

log = logging.getLogger("dgxmm.deploy.deployer")


class EngineStartFailed(Exception):
    pass


class StartReport(Protocol):
    """Where the deployer reports its engines' load times (dgxmm's metrics implement it)."""

    def launched(self, deployment_id: str, seconds: float, cached_fraction: float | None) -> None:
        """An engine became ready ``seconds`` after its launch (after the start-up gate);
        ``cached_fraction`` of its model's files were in the page cache as its start began
        (pagecache.CacheCount; None when unknown or not counted by the time it was ready)."""


class Unreported:
    """The report of a deployer built without one (tests): nothing is kept."""

    def launched(self, deployment_id: str, seconds: float, cached_fraction: float | None) -> None:
        pass


class StartWrites(Protocol):
    """What a start may do to deployment records: the ledger's writes it makes (ledger.py), nothing else."""

    def peek(self, deployment_id: str) -> Deployment | None: ...

    def mark_ready(
        self, deployment_id: str, reason: str = "", *, handle: RuntimeHandle | None = None, keep: bool = True
    ) -> Deployment: ...

    def set_memory_limit(self, deployment_id: str, limit: MemoryLimit | None) -> Deployment: ...

    def set_handle(self, deployment_id: str, handle: RuntimeHandle) -> None:
        """Where the launched engine is (written at once: a dgxmm restart finds it there)."""

    def gated(self, deployment_id: str) -> None:
        """The start began or stopped waiting at the start-up gate (listeners hear it)."""


Fail = Callable[..., Awaitable[None]]  # Ending.fail(deployment_id, reason, from_states=...)


class Serving(Protocol):
    """Whether a launched (or woken) engine serves."""

    async def wait(self, dep: Deployment, handle: RuntimeHandle, started: float, *, woken: bool) -> None:
        """Return once the engine serves; ``EngineStartFailed`` when it exits or times out."""

    async def wake(self, handle: RuntimeHandle, steps: Sequence[WakeStep]) -> None:
        """Tell an asleep engine to wake up, step by step in order (its sleep level's:
        sleeplevels.py); ``EngineStartFailed`` when it refuses one."""


class EngineProbe:
    """The real ``Serving``: the engine serves when its health path answers 200 and
    ``/v1/models`` lists its served name (the start-up gate's rule), probed soon after launch and
    at once when it writes something (``readiness``)."""

    def __init__(self, settings: DeployerSettings, http: aiohttp.ClientSession, runtime: Callable[[], Runtime]) -> None:
        self._settings = settings
        self._http = http
        self._runtime = runtime  # looked up at each call (tests replace the deployer's runtime)

    async def wait(self, dep: Deployment, handle: RuntimeHandle, started: float, *, woken: bool) -> None:
        path = engine_of(dep).health_path_of(dep)
        runtime = self._runtime()
        auth = handle.auth

        async def serving() -> bool:
            return await probe.healthy(self._http, handle.base_url, path, headers=auth) and await probe.lists_model(
                self._http, handle.base_url, dep.served_name, auth
            )

        def check_exit() -> None:
            ended = runtime.exit_reason(dep.id)
            if ended is not None:
                raise EngineStartFailed(f"engine exited during start-up ({ended})")

        if not await readiness.wait_ready(
            serving,
            lambda: runtime.output_size(dep.id),
            check_exit,
            max_interval_s=self._settings.start_poll_s,
            deadline=started + self._settings.start_timeout_s,
            first_at_once=woken,
        ):
            raise EngineStartFailed(f"not ready after {self._settings.start_timeout_s:g} s")
        if runtime.owns_listener(dep.id, handle) is False:
            # Another local process took the port first and answers in the engine's place:
            # never send it a caller's prompt (docs/server.md, "What another local user can do").
            raise EngineStartFailed(f"port {handle.port} is held by another process, not the engine")

    async def wake(self, handle: RuntimeHandle, steps: Sequence[WakeStep]) -> None:
        for step in steps:
            problem = await probe.post(self._http, handle.base_url + step.path, headers=handle.auth, body=step.json)
            if problem:
                raise EngineStartFailed(f"{step.path} refused: {problem}")


def _with_key(dep: Deployment, kind: EngineKind) -> tuple[Deployment, str | None]:
    """The record to launch and the key its engine will demand: a new one for each run, through
    the variable the kind reads (the environment of a process is its owner's alone to read, its
    command line everybody's), or the deployment's own if it sets that variable."""
    if kind.api_key_env is None:
        return dep, None
    key = dep.env.get(kind.api_key_env) or secrets.token_urlsafe(24)
    return dep.model_copy(update={"env": {**dep.env, kind.api_key_env: key}}), key


class Starts:
    def __init__(
        self,
        settings: DeployerSettings,
        records: StartWrites,
        runtime: Callable[[], Runtime],
        serving: Serving,
        fail: Fail,
        watch: Callable[[str], None],
        events: EventLog,
        limits: EngineLimits | None = None,
        report: StartReport | None = None,
        unified: bool = True,
    ) -> None:
        self._settings = settings
        self._unified = unified  # the host's memory is one pool: which sleep level is the default
        self._records = records
        self._runtime = runtime
        self._serving = serving
        self._fail = fail
        self._watch = watch
        self._events = events
        self._limits = limits
        self._report = report if report is not None else Unreported()
        self._gate = asyncio.Semaphore(settings.max_concurrent_starts)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._gated: set[str] = set()  # starts waiting for another engine to finish loading

    def start(self, deployment_id: str) -> None:
        """Launch the engine of a deployment just marked starting, as a task of its own."""
        self._spawn(deployment_id, self._run_start(deployment_id))

    def wake(self, deployment_id: str) -> None:
        """Wake the engine of a deployment just marked starting from asleep."""
        self._spawn(deployment_id, self._run_wake(deployment_id))

    def task(self, deployment_id: str) -> asyncio.Task[None] | None:
        """The start or wake running for the deployment, if one is (a stop cancels it first)."""
        return self._tasks.get(deployment_id)

    def waiting_for_gate(self, deployment_id: str) -> bool:
        return deployment_id in self._gated

    async def close(self) -> None:
        """dgxmm is exiting: cancel every start and wake, and wait for them."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _spawn(self, deployment_id: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro, name=f"start-{deployment_id}")
        self._tasks[deployment_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._tasks.get(deployment_id) is done:
                del self._tasks[deployment_id]

        task.add_done_callback(forget)

    async def _run_start(self, deployment_id: str) -> None:
        # How much of the model the page cache holds now, before the engine reads any of it:
        # counted beside the start, which never waits for it (pagecache.CacheCount).
        counted = self._records.peek(deployment_id)
        count = CacheCount(counted.local_model) if counted is not None else None
        try:
            if self._gate.locked():
                self._gated.add(deployment_id)
                self._records.gated(deployment_id)
                self._events.event("deployer", deployment_id, "Waiting for another engine to load")
            async with self._gate:
                self._leave_gate(deployment_id)
                started = time.monotonic()  # the start timeout counts from the launch, not the gate
                dep = self._with_limit(deployment_id)
                kind = engine_of(dep)
                launched, key = _with_key(dep, kind)
                handle = await self._runtime().start(launched, kind)
                if key is not None:
                    handle = handle.model_copy(update={"api_key": key})
                self._records.set_handle(deployment_id, handle)
                await self._serving.wait(dep, handle, started, woken=False)
                loaded = time.monotonic() - started
        except (LaunchError, EngineStartFailed, StoreUnavailable) as exc:
            await self._fail(deployment_id, str(exc), from_states=(State.STARTING,))
            return
        except Exception as exc:  # a bug must not leave it starting (and holding memory) forever
            log.exception("start of %s failed", deployment_id, extra=fields(deployment_id))
            await self._fail(deployment_id, f"start failed: {type(exc).__name__}: {exc}", from_states=(State.STARTING,))
            return
        finally:
            self._leave_gate(deployment_id)  # also when cancelled at the gate
            cached = count.result() if count is not None else None  # (and the count stops)
        if await self._become_ready(deployment_id, started):
            self._report.launched(deployment_id, loaded, cached)

    def _leave_gate(self, deployment_id: str) -> None:
        if deployment_id in self._gated:
            self._gated.discard(deployment_id)
            self._records.gated(deployment_id)

    def _with_limit(self, deployment_id: str) -> Deployment:
        """The record to launch, its memory limit worked out again: the model's files or the
        device total may have changed since the last start."""
        dep = self._require(deployment_id)
        if self._limits is None:
            return dep
        try:
            limit = self._limits.resolve(dep)
        except InvalidInput as exc:
            raise EngineStartFailed(exc.message) from None
        if limit != dep.memory_limit:
            return self._records.set_memory_limit(deployment_id, limit)
        return dep

    async def _run_wake(self, deployment_id: str) -> None:
        started = time.monotonic()
        dep = self._require(deployment_id)
        handle = dep.runtime_handle
        try:
            if handle is None:
                raise EngineStartFailed("no engine to wake")
            await self._serving.wake(handle, LEVELS[level_of(dep, self._unified)].wake)
            await self._serving.wait(dep, handle, started, woken=True)
        except EngineStartFailed as exc:
            await self._fail(deployment_id, str(exc), from_states=(State.STARTING,))
            return
        await self._become_ready(deployment_id, started)

    async def _become_ready(self, deployment_id: str, started: float) -> bool:
        """Mark it ready, or, when that record cannot be written, failed with its engine stopped
        (an engine must not serve behind a record that says it is starting)."""
        dep = self._records.peek(deployment_id)
        if dep is None or dep.state is not State.STARTING:  # removed or stopped meanwhile
            return False
        try:
            self._records.mark_ready(deployment_id, keep=False)
        except StoreUnavailable as exc:
            await self._fail(deployment_id, f"the engine is ready, but {exc.message}", from_states=(State.STARTING,))
            return False
        self._watch(deployment_id)
        self._events.event("deployer", deployment_id, f"Ready after {time.monotonic() - started:.2f} s")
        return True

    def _require(self, deployment_id: str) -> Deployment:
        dep = self._records.peek(deployment_id)
        if dep is None:
            raise EngineStartFailed("the deployment was removed")
        return dep
