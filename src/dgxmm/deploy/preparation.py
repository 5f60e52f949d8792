"""Deployments whose model a hub names: ``planned`` until the model store has verified their files.

A deployment whose ``model`` is ``hf://ORG/REPO[@REVISION][/PATH]`` (``Deployment.from_hub``)
cannot start an engine until the model store (modelstore/) has fetched the files the name stands
for and checked them against the hub's sizes and SHA-256. Until then it is ``planned``: a start
is refused (``restart`` wants stopped or failed) and the controller waits on it as on any state
it may not start. Its ``state_reason`` says how far the download is ("downloading 3.2 of 18.0
GiB, 120 MiB/s, about 2 min left"), written as the store reports progress but at most once every
``PROGRESS_S``, so its views reach the console about once a second. Then:

* the downloaded file is checked as the admin API checks a local model at create: a llama.cpp
  model must begin with the GGUF magic and must not be larger than ``memory_gib`` (the same
  messages); what llama.cpp will hold for it (deploy/estimate.py) becomes an event;
* ``model_path`` is set: the local file or snapshot directory the engine is given;
* it becomes what it would have been at create: an on-demand one ``stopped`` (its first request
  starts it), an always-on one started, or ``stopped`` with the reason when it does not fit now
  (as the reconcile leaves one).

A pull that fails leaves the deployment ``failed`` with the download's error. A start of it (the
API's, the controller's for a request, the reconcile's) pulls again: ``Deployer.restart`` asks
``local_path`` first and, when the files are not here, hands the deployment back here (``again``).
An edit of its model begins anew.

The model store is reached only through ``ModelFiles`` (app.py hands in the store, which never
reaches into the deployer); records change only through the ledger's writes ``PreparationWrites``
names (ledger.py). One task per planned deployment; it ends when the deployment leaves
``planned``, is removed or names another model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from dgxmm.deploy.auditing import EventLog
from dgxmm.deploy.budget import InsufficientMemory
from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.estimate import estimate
from dgxmm.deploy.ggufheader import DEADLINE_S, NotAModel, why_not_gguf
from dgxmm.deploy.limits import EngineLimits
from dgxmm.errors import Conflict, DgxmmError, InvalidInput, NotFound, StoreUnavailable
from dgxmm.logs import fields
from dgxmm.records.deployment import Deployment, MemoryLimit, State

log = logging.getLogger("dgxmm.deploy.deployer")

PROGRESS_S = 1.0  # a planned deployment's progress is written (and published) at most this often
CHECK_TIMEOUT_S = DEADLINE_S + 1  # the downloaded file's checks, read off the loop


def waiting(model: str) -> str:
    """The reason of a deployment planned before its download reports progress."""
    return f"waiting for the files of {model}"


class Files(Protocol):
    """What the model store says of a model's files now."""

    @property
    def path(self) -> str | None:
        """The local file or snapshot directory, verified; None until then."""

    @property
    def downloading(self) -> bool: ...

    @property
    def reason(self) -> str:
        """How far the download is, or why the files are not here."""


class ModelFiles(Protocol):
    """What the deployer asks of the model store, by a deployment's ``model``."""

    def readiness_of(self, model: str) -> Files: ...

    async def fetch(self, model: str, user: str | None) -> None:
        """Pull what ``model`` needs unless it is here or coming (``InvalidInput`` when the
        repository has no such file); a pull the hub refuses shows in ``files``."""

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` after every change and progress of any model."""


class PreparationWrites(Protocol):
    """What a preparation may do to deployment records: the ledger's writes it makes (ledger.py),
    nothing else."""

    def peek(self, deployment_id: str) -> Deployment | None: ...

    def all(self) -> list[Deployment]: ...

    def mark_stopped(self, deployment_id: str, reason: str = "") -> Deployment: ...

    def mark_failed(self, deployment_id: str, reason: str) -> Deployment: ...

    def mark_planned(self, deployment_id: str, reason: str) -> Deployment: ...

    def declare_stopped(self, deployment_id: str, reason: str) -> Deployment: ...

    def set_model_path(self, deployment_id: str, path: str | None, memory_limit: MemoryLimit | None) -> Deployment: ...

    def set_reason(self, deployment_id: str, reason: str) -> None:
        """A planned deployment's reason (listeners hear ``progress``)."""


class Restart(Protocol):
    """The deployer's start of a stopped deployment whose files are here (``Deployer.restart``)."""

    def __call__(self, deployment_id: str, *, actor: str) -> None: ...


class Preparation:
    def __init__(
        self,
        records: PreparationWrites,
        restart: Restart,
        models: ModelFiles | None,
        events: EventLog,
        limits: EngineLimits | None = None,
    ) -> None:
        self._records = records
        self._restart = restart
        self._models = models
        self._events = events
        self._limits = limits
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        if models is not None:
            models.add_listener(self._wake)

    def local_path(self, dep: Deployment) -> str | None:
        """The verified local path of ``dep``'s hub model now; None when its files are not here
        (no engine may start on it: it is pulled first)."""
        return None if self._models is None else self._models.readiness_of(dep.model).path

    def at_create(self, dep: Deployment) -> Deployment:
        """A new record as it is stored: ``stopped``, or ``planned`` for a hub model whose files
        are not here (``begin`` once it is stored), with ``model_path`` when they are."""
        path = self.local_path(dep) if dep.from_hub else None
        if dep.from_hub and path is None:
            return dep.model_copy(
                update={"model_path": None, "state": State.PLANNED, "state_reason": waiting(dep.model)}
            )
        return dep.model_copy(update={"model_path": path, "state": State.STOPPED, "state_reason": ""})

    def for_start(self, dep: Deployment, *, actor: str, user: str | None) -> bool:
        """A start of a hub model (``restart``, in its plain call): True when its files are here
        (``model_path`` the store's now); False when they are not, and it went back to
        ``planned`` to fetch them (``again``)."""
        path = self.local_path(dep)
        if path is None:
            self.again(dep.id, actor=actor, user=user)
            return False
        if path != dep.model_path:
            self._records.set_model_path(dep.id, path, dep.memory_limit)
        return True

    def begin(self, deployment_id: str, *, user: str | None = None) -> None:
        """Prepare a deployment stored ``planned``: pull what its model needs, as a task of its
        own (one that prepared it before for another model ends)."""
        old = self._tasks.pop(deployment_id, None)
        if old is not None:
            old.cancel()
        task = asyncio.create_task(self._run(deployment_id, user), name=f"prepare-{deployment_id}")
        self._tasks[deployment_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._tasks.get(deployment_id) is done:
                del self._tasks[deployment_id]

        task.add_done_callback(forget)

    def again(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        """A start of a stopped or failed deployment whose files are not here (its pull failed,
        or they went): planned, its pull begun again. Plain: check and write in one call."""
        dep = self._records.peek(deployment_id)
        assert dep is not None
        if dep.model_path is not None:  # (files that went: no engine is given them again)
            self._records.set_model_path(deployment_id, None, dep.memory_limit)
        self._records.mark_planned(deployment_id, waiting(dep.model))
        self._events.event(actor, deployment_id, f"Fetching {dep.model} again")
        self.begin(deployment_id, user=user)

    def model_changed(self, deployment_id: str, *, user: str | None) -> None:
        """An edit gave the deployment another model: a hub one is prepared anew (planned); a
        local one leaves ``planned`` (it is stopped, as an edited deployment is)."""
        dep = self._records.peek(deployment_id)
        if dep is None:
            return
        path = self.local_path(dep) if dep.from_hub else None
        if path is not None:  # here already: nothing to fetch
            self._records.set_model_path(deployment_id, path, dep.memory_limit)
            if dep.state is State.PLANNED:
                self._records.mark_stopped(deployment_id)
        elif dep.from_hub:
            if dep.state is State.PLANNED:
                self._records.set_reason(deployment_id, waiting(dep.model))
            else:
                self._records.mark_planned(deployment_id, waiting(dep.model))
            self.begin(deployment_id, user=user)
        elif dep.state is State.PLANNED:
            self._records.mark_stopped(deployment_id)

    def resume(self) -> None:
        """At start-up: every planned deployment picks up its pull (the model store resumes
        the transfer from the bytes on disk)."""
        for dep in self._records.all():
            if dep.state is State.PLANNED and dep.from_hub:
                self.begin(dep.id)

    async def close(self) -> None:
        """dgxmm is exiting: the preparations end (their deployments stay planned, resumed at the
        next start; the transfers are the model store's)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _wake(self) -> None:
        for wakeup in self._wakeups.values():
            wakeup.set()

    async def _run(self, deployment_id: str, user: str | None) -> None:
        dep = self._records.peek(deployment_id)
        if dep is None or self._models is None:
            if dep is not None:
                self._fail(deployment_id, dep.model, f"{dep.model}: this dgxmm has no model store to fetch it")
            return
        model = dep.model
        wakeup = self._wakeups[deployment_id] = asyncio.Event()
        try:
            files = self._models.readiness_of(model)
            if files.path is None and not files.downloading:  # (here, or coming: the hub is not asked)
                try:
                    await self._models.fetch(model, user)
                except DgxmmError as exc:
                    self._fail(deployment_id, model, exc.message)
                    return
            await self._follow(deployment_id, model, wakeup)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must not leave it planned for ever
            log.exception("the preparation of %s failed", deployment_id, extra=fields(deployment_id))
            self._fail(deployment_id, model, f"preparation failed: {type(exc).__name__}: {exc}")
        finally:
            if self._wakeups.get(deployment_id) is wakeup:
                del self._wakeups[deployment_id]

    async def _follow(self, deployment_id: str, model: str, wakeup: asyncio.Event) -> None:
        """Until the files are here (then ``_ready``) or the pull ends otherwise (``_fail``): the
        progress into the reason, at most once every ``PROGRESS_S``."""
        assert self._models is not None
        loop = asyncio.get_running_loop()
        written_at = float("-inf")
        while True:
            wakeup.clear()  # (before the look: a change from here on is not missed)
            dep = self._records.peek(deployment_id)
            if not _still(dep, model):
                return
            assert dep is not None
            files = self._models.readiness_of(model)
            if files.path is not None:
                await self._ready(deployment_id, model, files.path)
                return
            if not files.downloading:
                self._fail(deployment_id, model, files.reason)
                return
            wait: float | None = None
            if files.reason != dep.state_reason:
                due = written_at + PROGRESS_S
                if loop.time() >= due:
                    self._records.set_reason(deployment_id, files.reason)
                    written_at = loop.time()
                else:
                    wait = due - loop.time()
            try:
                async with asyncio.timeout(wait):
                    await wakeup.wait()
            except TimeoutError:
                pass

    async def _ready(self, deployment_id: str, model: str, path: str) -> None:
        """The files are here: check them as a create would, set ``model_path``, and become
        what the deployment would have been at create."""
        dep = self._records.peek(deployment_id)
        assert dep is not None
        problem, note = await self._check(dep.model_copy(update={"model_path": path}))
        dep = self._records.peek(deployment_id)
        if not _still(dep, model):
            return
        assert dep is not None
        limit: MemoryLimit | None = dep.memory_limit
        if problem is None and self._limits is not None:
            try:  # (plain: the model's size is read within weights.py's bounds)
                limit = self._limits.resolve(dep.model_copy(update={"model_path": path}))
            except InvalidInput as exc:
                problem = exc.message
        if problem is not None:
            self._fail(deployment_id, model, problem)
            return
        self._records.set_model_path(deployment_id, path, limit)
        self._events.event("deployer", deployment_id, f"Fetched {model} into {path}" + (f"; {note}" if note else ""))
        self._records.mark_stopped(deployment_id)
        if dep.is_on_demand:
            return  # its first request starts it
        try:
            self._restart(deployment_id, actor="deployer")
        except (InsufficientMemory, Conflict, NotFound, StoreUnavailable) as exc:
            self._records.declare_stopped(deployment_id, f"not started: {exc}")

    async def _check(self, dep: Deployment) -> tuple[str | None, str | None]:
        """What makes the downloaded file unusable (the admin API's message for a local model),
        and what llama.cpp will hold for it; read off the loop, within ``CHECK_TIMEOUT_S``."""
        if engine_of(dep).memory_limit != "gguf":
            return None, None
        path = Path(dep.local_model)
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                why = await asyncio.to_thread(why_not_gguf, path)
                if why is not None:
                    return f"model: {path}: {why}", None
                found = await asyncio.to_thread(estimate, path, dep.args)
        except TimeoutError:
            return f"model: {path}: its file did not answer within {CHECK_TIMEOUT_S:g} s", None
        except NotAModel as exc:
            return None, f"no memory estimate: {exc}"
        note = f"llama.cpp will hold about {found.total_gib:.1f} GiB with its arguments"
        if found.suggested_gib > dep.memory_gib:
            note += f", more than memory_gib {dep.memory_gib:g}: set memory_gib to {found.suggested_gib:g}"
        return None, note

    def _fail(self, deployment_id: str, model: str, reason: str) -> None:
        dep = self._records.peek(deployment_id)
        if not _still(dep, model):
            return
        self._records.mark_failed(deployment_id, reason)
        self._events.event("deployer", deployment_id, f"Failed: {reason}")


def _still(dep: Deployment | None, model: str) -> bool:
    """The deployment is still planned for ``model`` (not removed, edited or started meanwhile)."""
    return dep is not None and dep.state is State.PLANNED and dep.model == model
