"""The deployer: every engine start and stop, and the checks before each change of a deployment record.

The records themselves, frozen, and the named writes that store each change as a new record are
``ledger.Ledger`` (``mark_ready``, ``declare_stopped``, ``set_model_path`` ...); this module
decides what changes and when, and hands the ledger to deploy/'s own parts only.

Contracts the rest of dgxmm relies on (see docs/deployer.md):

* Check and write in one plain call: every transition that must be atomic (``create``,
  ``restart``, ``wake``, the first half of ``sleep``, ``stop`` and ``remove``) reads the record,
  checks it and writes the new state in a plain (non-async) method. Nothing else runs on the
  event loop during a plain call, and an ``await`` cannot be written into one, so a stop approved
  by its precheck cannot interleave with anything that reads the state (the controller granting a
  slot). That is the deployer's lock; there is no ``asyncio.Lock`` (it excluded nothing).
* Every start passes the fit check (``InsufficientMemory``) and then the start-up gate: at most
  ``max_concurrent_starts`` engines load at once; a started engine is ready only when its health
  path answers 200 and ``/v1/models`` lists its served name, and failed after the start timeout.
* Listeners hear every creation, state change, config change and removal synchronously, in
  order, after the change is stored. ``pending_mode`` is applied in the same transaction as the
  change to ready, failed or stopped.
* Marking an engine failed never waits on anything that can fail first: the log tail is read
  with a time limit and its failure becomes part of the reason; the event and the engine's stop
  come after the mark and cannot undo it.
* A failing disk never leaves an engine running behind a record that says otherwise: what
  happened to an engine is held and written once the database can be written (``Store.put``
  with ``keep``); a change a caller asks for is refused with ``StoreUnavailable`` (503) until then.
* Served names and aliases are unique on a host (``names.Names``): 422 before anything is written.
* Devices: a start runs where the fit check places it (``placement``), kept as ``placed_on``.
* Shutdown (``begin_shutdown``, then ``close``): no start or wake is accepted any more; at the end
  engines that cannot outlive dgxmm are stopped with their grace and recorded ``stopped`` with the
  reason ``dgxmm stopped`` (always-on ones start again at the next start-up).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from dgxmm.deploy import probe
from dgxmm.deploy.budget import MemoryBudget, Snapshot
from dgxmm.records.changes import Change, Listener, Precheck
from dgxmm.deploy.auditing import audit_view, started_on
from dgxmm.deploy.edits import Edits
from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.limits import EngineLimits
from dgxmm.deploy.liveness import Liveness
from dgxmm.deploy.ledger import Ledger
from dgxmm.deploy.preparation import ModelFiles, Preparation
from dgxmm.records.deployment import (
    RUNNING,
    Deployment,
    RuntimeHandle,
    State,
)
from dgxmm.deploy.runtimes.base import Runtime
from dgxmm.deploy.sleeplevels import LEVELS, level_of
from dgxmm.deploy.ending import Ending
from dgxmm.deploy.starts import EngineProbe, Serving, StartReport, Starts
from dgxmm.deploy.watchdog import Watchdog
from dgxmm.errors import Conflict, DgxmmError, NotFound
from dgxmm.events import EventBus
from dgxmm.settings import DeployerSettings
from dgxmm.store.db import Store
from dgxmm.supervisor import Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Stopping:
    """An approved stop: the start or wake task to cancel first, if one runs."""

    op: asyncio.Task[None] | None


class Deployer:
    def __init__(
        self,
        settings: DeployerSettings,
        store: Store,
        bus: EventBus,
        budget: MemoryBudget,
        runtime: Runtime,
        http: aiohttp.ClientSession,
        limits: EngineLimits | None = None,
        supervisor: Supervisor | None = None,
        report: StartReport | None = None,
        liveness: Liveness | None = None,
        serving: Serving | None = None,
        models: ModelFiles | None = None,
    ) -> None:
        self.settings = settings
        self.budget = budget
        self.runtime = runtime
        self.limits = limits
        self._bus = bus
        self._http = http
        self._ledger = Ledger(store)  # the records and their named writes
        self._deps = self._ledger.records
        self._names = self._ledger.names
        self._require, self._notify = self._ledger.require, self._ledger.notify
        self._name_of, self._require_writable = self._ledger.name_of, self._ledger.require_writable
        self._removing: set[str] = set()
        # The runtime is looked up at each call (tests replace the deployer's runtime or its methods).
        self._watchdog = Watchdog(
            settings,
            self.find,
            lambda dep_id: self.runtime.wait_exit(dep_id),
            self.fail,
            http,
            supervisor or Supervisor(),
            (liveness or Liveness()).signs,
        )
        self._ending = Ending(
            settings, self._ledger, lambda: self.runtime, self._watchdog.unwatch, bus, release=budget.page_cache.release
        )
        self._starts = Starts(
            settings,
            self._ledger,
            lambda: self.runtime,
            serving or EngineProbe(settings, http, lambda: self.runtime),
            self._ending.fail,
            self._watchdog.watch,
            bus,
            limits,
            report,
            unified=budget.pooled,
        )
        # An operator's edits, checked (edits.py), and the ledger's writes other parts ask for by name.
        self._edits = Edits(self._ledger, bus, budget, limits, lambda dep_id: dep_id in self._removing)
        self.reset_after_edit = self._edits.reset_after_edit
        self.switch_mode = self._ledger.switch_mode
        self.pend_mode = self._ledger.pend_mode
        self.move_declaration = self._ledger.move_declaration
        self.declare_stopped = self._ledger.declare_stopped  # (the reconcile's, after a dgxmm restart)
        self.preparing = Preparation(self._ledger, self.restart, models, bus, limits)  # hub models' files
        self._closing = False

    # --- reading ------------------------------------------------------------------------------

    # Every reader gets the stored record itself: it is frozen (``Deployment``), so no reader can
    # change it, and a write stores a new record in its place.

    def find(self, deployment_id: str) -> Deployment | None:
        return self._deps.get(deployment_id)

    def peek(self, deployment_id: str) -> Deployment | None:
        """As ``find`` (the name the gateway's hot path knows it by)."""
        return self._deps.get(deployment_id)

    def get(self, deployment_id: str) -> Deployment:
        dep = self.find(deployment_id)
        if dep is None:
            raise NotFound(f"no deployment {deployment_id}")
        return dep

    def by_name(self, name: str) -> Deployment | None:
        """The stored record of the deployment whose served name or alias is ``name``."""
        found = self._names.find(name)
        return None if found is None else self._deps.get(found)

    def all(self) -> list[Deployment]:
        return list(self._deps.values())

    def peek_all(self) -> list[Deployment]:
        """As ``all`` (the name the live status knows it by)."""
        return list(self._deps.values())

    def held_gib(self, dep: Deployment) -> float:
        """What ``dep`` counts for in the budget while it holds memory (declared, or measured if more)."""
        return self.budget.held_of(dep)

    def snapshot(self, exclude: str | None = None) -> Snapshot:
        return self.budget.snapshot(self._deps.values(), exclude=exclude, lingering=self._ending.lingering)

    def _fit(self, dep: Deployment, devices: Sequence[int] | None = None) -> list[int] | None:
        """The fit check (``InsufficientMemory``): the devices ``dep`` starts on, as ``placed_on``."""
        placed = self.budget.fit(dep, self._deps.values(), lingering=self._ending.lingering, devices=devices)
        return None if self.budget.pooled else list(placed)

    def starting_task(self, deployment_id: str) -> asyncio.Task[None] | None:
        return self._starts.task(deployment_id)

    def waiting_for_gate(self, deployment_id: str) -> bool:  # starting, but behind another engine's load
        return self._starts.waiting_for_gate(deployment_id)

    def add_listener(self, listener: Listener) -> None:
        self._ledger.listeners.append(listener)

    # --- writing ------------------------------------------------------------------------------

    def create(self, dep: Deployment, *, user: str | None, start: bool, actor: str = "api") -> Deployment:
        """Store a new deployment and, with ``start``, start it; a start that does not fit raises
        ``InsufficientMemory`` and nothing is created. Check and write in one plain call."""
        if start:
            self._refuse_when_closing()
        self._require_writable()
        if any(other.name == dep.name for other in self._deps.values()):
            raise Conflict(f"a deployment named {dep.name!r} exists", field="name")
        dep = self.budget.settled(dep)  # (the caller's record is left as it is: a new one is stored)
        dep = self.preparing.at_create(dep.model_copy(update={"id": dep.id or secrets.token_hex(6)}))
        planned = dep.state is State.PLANNED  # a hub model whose files are fetched first
        self._names.check(dep, self._name_of)
        if self.limits is not None:  # InvalidInput (422) before anything is stored
            dep = dep.model_copy(update={"memory_limit": self.limits.resolve(dep)})
        placed = self._fit(dep) if start else None
        dep = self._ledger.add(dep)
        self._bus.audit("create", actor=actor, user=user, deployment_id=dep.id, new=audit_view(dep))
        self._bus.event(actor, dep.id, f"Created {dep.name} ({dep.engine}, {dep.memory_gib:g} GiB)")
        self._notify(Change("created", dep))
        if planned:
            self.preparing.begin(dep.id, user=user)
        elif start:
            self._ledger.mark_starting(dep.id, placed)
            self._starts.start(dep.id)
        return self.get(dep.id)

    def reconfigure(
        self, deployment_id: str, changes: dict[str, Any], *, user: str | None, actor: str = "api"
    ) -> Deployment:
        """An operator's edit of a deployment whose engine is not running (``edits.Edits``); a
        hub model it now names is fetched (planned)."""
        written = self._edits.reconfigure(deployment_id, changes, user=user, actor=actor)
        if "model" in written:
            self.preparing.model_changed(deployment_id, user=user)
        return self.get(deployment_id)

    # --- starting -----------------------------------------------------------------------------

    def restart(
        self, deployment_id: str, *, actor: str, user: str | None = None, devices: Sequence[int] | None = None
    ) -> None:
        """Start a stopped or failed deployment again: fit check (on ``devices`` when the caller
        placed it, else the best fit), mark ``starting`` and launch the engine as the deployer's
        own task, in one plain call. Raises ``InsufficientMemory``, ``Conflict`` or ``NotFound``
        with nothing changed. Listeners see the outcome."""
        self._refuse_when_closing()
        dep = self._require(deployment_id)
        if deployment_id in self._removing:
            raise NotFound(f"deployment {deployment_id} is being removed")
        if dep.state not in (State.STOPPED, State.FAILED):
            raise Conflict(f"deployment {dep.name} is {dep.state}, not stopped or failed")
        self._require_writable()
        if dep.from_hub and not self.preparing.for_start(dep, actor=actor, user=user):
            return  # its files are not here: planned, fetched first (no engine before they are verified)
        placed = self._fit(dep, devices)
        self._ledger.mark_starting(deployment_id, placed)
        self._starts.start(deployment_id)
        self._bus.event(actor, deployment_id, "Starting" + started_on(placed))

    def wake(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        """Wake an asleep engine; like ``restart``, one plain call that leaves it starting."""
        self._refuse_when_closing()
        dep = self._require(deployment_id)
        if dep.state is not State.ASLEEP:
            raise Conflict(f"deployment {dep.name} is {dep.state}, not asleep")
        self._require_writable()
        self._fit(dep, self.budget.devices_of(dep))  # it wakes where it sleeps
        self._ledger.mark_waking(deployment_id)
        self._starts.wake(deployment_id)
        self._bus.event(actor, deployment_id, "Waking")

    def _refuse_when_closing(self) -> None:
        if self._closing:
            raise Conflict("dgxmm is shutting down: nothing is started any more")

    # --- sleeping, stopping, removing ---------------------------------------------------------

    async def sleep(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        dep = self._begin_sleep(deployment_id)
        assert dep.runtime_handle is not None
        level = level_of(dep, self.budget.pooled)
        problem = await probe.post(
            self._http, dep.runtime_handle.base_url + LEVELS[level].sleep_path, headers=dep.runtime_handle.auth
        )
        if problem and self._require(deployment_id).state is State.ASLEEP:
            self._ledger.mark_ready(deployment_id, f"sleep refused: {problem}")
            raise Conflict(f"the engine refused to sleep: {problem}")
        self._bus.event(actor, deployment_id, f"Put to sleep (level {level})")

    def _begin_sleep(self, deployment_id: str) -> Deployment:
        """Check and write: ready with a sleep mode, marked asleep (the engine is told next)."""
        dep = self._require(deployment_id)
        if not engine_of(dep).sleeps(dep):
            raise Conflict(f"engine {dep.engine} of {dep.name} has no sleep mode enabled")
        if dep.state is not State.READY or dep.runtime_handle is None:
            raise Conflict(f"deployment {dep.name} is {dep.state}, not ready")
        self._ledger.mark_asleep(deployment_id)
        return dep

    async def stop(
        self,
        deployment_id: str,
        precheck: Precheck | None = None,
        *,
        actor: str,
        user: str | None = None,
        reason: str = "stopped",
    ) -> bool:
        """Stop the engine. ``precheck`` sees the current record and, if it approves, the
        deployment is marked stopping in the same plain call (``_begin_stop``); if it refuses,
        nothing happens. Returns whether the stop went ahead (False also when there was nothing
        to stop), once the engine is stopped."""
        stopping = self._begin_stop(deployment_id, precheck, reason)
        if stopping is None:
            return False
        await self._finish_stop(deployment_id, stopping.op, actor=actor, reason=reason)
        return True

    def _begin_stop(self, deployment_id: str, precheck: Precheck | None, reason: str) -> _Stopping | None:
        """Check and write: something to stop, the precheck approves, mark stopping."""
        dep = self._require(deployment_id)
        if dep.state not in RUNNING and dep.state is not State.FAILED:
            return None
        if dep.state is State.STOPPING:
            return None
        if precheck is not None and not precheck(dep):
            return None
        self._ledger.mark_stopping(deployment_id, reason)
        return _Stopping(self._starts.task(deployment_id))

    async def _finish_stop(self, deployment_id: str, op: asyncio.Task[None] | None, *, actor: str, reason: str) -> None:
        if op is not None:
            op.cancel()
            await asyncio.wait([op])
        self._watchdog.unwatch(deployment_id)
        await self.runtime.stop(deployment_id, self.settings.stop_grace_s)
        await self._ending.end_leftovers(deployment_id)
        dep = self._deps.get(deployment_id)
        if dep is not None and dep.state is State.STOPPING:
            self._ledger.mark_stopped(deployment_id, reason if reason != "stopped" else "")
            # One event per stop: a stop given in words ("Stopped to make room for x") says why.
            self._bus.event(actor, deployment_id, "Stopped" if reason in ("stopped", "removing") else reason)

    async def remove(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        op = self._begin_remove(deployment_id)
        try:
            await self._finish_stop(deployment_id, op, actor=actor, reason="removing")
            gone = self._ledger.forget(deployment_id)  # (StoreUnavailable: the engine is stopped, the record kept)
        finally:
            self._removing.discard(deployment_id)
        try:  # its kept compile work goes with it
            await self.runtime.clear_compile_cache(deployment_id)
        except DgxmmError as exc:  # (Docker not answering: the volume stays, docs/engines.md)
            log.warning("compile cache of %s kept: %s", deployment_id, exc)
        self._bus.audit("remove", actor=actor, user=user, deployment_id=deployment_id, old=audit_view(gone))
        self._bus.event(actor, deployment_id, f"Removed {gone.name}")
        self._notify(Change("removed", gone, old_state=gone.state))

    def _begin_remove(self, deployment_id: str) -> asyncio.Task[None] | None:
        """Check and write: not already being removed; a running engine is marked stopping."""
        dep = self._require(deployment_id)
        if deployment_id in self._removing:
            raise Conflict(f"deployment {dep.name} is already being removed")
        self._require_writable()
        self._removing.add(deployment_id)
        if dep.state in RUNNING and dep.state is not State.STOPPING:
            self._ledger.mark_stopping(deployment_id, "removing")
        return self._starts.task(deployment_id)

    # --- life of the service ------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """dgxmm is stopping: from now on no start or wake is accepted (Conflict)."""
        self._closing = True

    def adopt(self, deployment_id: str, handle: RuntimeHandle) -> None:
        """After a dgxmm restart (``reconcile``): the engine found running serves, so it is kept
        and watched; a deployment left starting finished loading while no dgxmm watched."""
        dep = self._require(deployment_id)
        if dep.state is State.STARTING:
            self._ledger.mark_ready(dep.id, "adopted after a dgxmm restart", handle=handle)
        elif dep.runtime_handle != handle:
            self._ledger.set_handle(dep.id, handle)
        self._watchdog.watch(dep.id)
        self._bus.event("deployer", dep.id, "Adopted the running engine")

    async def close(self, *, stop_engines: bool = False) -> None:
        """dgxmm is exiting: stop watching and starting. Engines the runtime cannot keep beyond
        dgxmm (child processes), or all of them when ``stop_engines`` (``dgxmm stop
        --stop-engines``), are stopped with their grace and recorded stopped; the others outlive
        it and are adopted at the next start."""
        self._closing = True
        self._watchdog.close()
        await self.preparing.close()
        await self._starts.close()
        if stop_engines or not self.runtime.engines_outlive_dgxmm:
            running = [dep.id for dep in self._deps.values() if dep.state in RUNNING]
            await asyncio.gather(*(self._ending.stop_for_shutdown(dep_id) for dep_id in running))
        await self.runtime.close()

    async def logs(self, deployment_id: str, tail: int, before: int | None = None) -> list[str]:
        """The engine's last ``tail`` lines, or those ending at the log position ``before``."""
        self._require(deployment_id)
        if before is not None:
            return await self.runtime.logs_before(deployment_id, tail, before)
        return await self.runtime.logs(deployment_id, tail)

    async def fail(self, deployment_id: str, reason: str) -> None:
        """The watchdog's way in: a ready or asleep engine that died or stopped answering."""
        await self._ending.fail(deployment_id, reason, from_states=(State.READY, State.ASLEEP))
