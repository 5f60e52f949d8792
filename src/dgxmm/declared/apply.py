"""Applying a plan through the deployer's public methods, never around them.

The spec's "never stop a busy model" holds here too: a running deployment that must restart, or
that was removed from the files, is stopped only by a stop whose precheck sees nothing in flight
(checked in the deployer's plain call that marks it stopping, so no request can be granted in
between). A deployment that is busy, starting or stopping is left for the next round: the watcher
applies again every poll while the last plan was not empty, and the plan is recomputed each time
from the deployments as they are, so a round that could do only part of the work never leaves a
deployment half-changed and the next one finishes it. As declared, nothing is written.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from dgxmm.declared.parse import Declaration
from dgxmm.declared.plan import Change, Creation, Plan, Removal, plan
from dgxmm.deploy.budget import InsufficientMemory
from dgxmm.errors import DgxmmError
from dgxmm.records.changes import Precheck
from dgxmm.records.deployment import Deployment, Mode, State

log = logging.getLogger(__name__)

ACTOR = "config"  # who the events and audit rows of declared changes name
MODE_FIELDS = ("mode", "idle_timeout_s")
Busy = Callable[[str], bool]  # whether the deployment has requests in flight or waiting
SetMode = Callable[[str, Mode, "float | None"], Awaitable[Any]]
Preload = Callable[[list[str]], Any]


class PlanDeployer(Protocol):
    """What applying a plan calls of the deployer: its public writes, nothing around them."""

    def all(self) -> list[Deployment]: ...

    def find(self, deployment_id: str) -> Deployment | None: ...

    def get(self, deployment_id: str) -> Deployment: ...

    def create(self, dep: Deployment, *, user: str | None, start: bool, actor: str = "api") -> Deployment: ...

    def move_declaration(self, deployment_id: str, declared_in: str) -> None: ...

    def reconfigure(
        self, deployment_id: str, changes: dict[str, Any], *, user: str | None, actor: str = "api"
    ) -> Deployment: ...

    def restart(
        self, deployment_id: str, *, actor: str, user: str | None = None, devices: Sequence[int] | None = None
    ) -> None: ...

    async def stop(
        self,
        deployment_id: str,
        precheck: Precheck | None = None,
        *,
        actor: str,
        user: str | None = None,
        reason: str = "stopped",
    ) -> bool: ...

    async def remove(self, deployment_id: str, *, actor: str, user: str | None = None) -> None: ...


class Applier:
    def __init__(self, deployer: PlanDeployer, *, busy: Busy, set_mode: SetMode, preload: Preload) -> None:
        self._deployer = deployer
        self._busy = busy
        self._set_mode = set_mode
        self._preload = preload
        self._said: set[str] = set()  # what could not be done yet, logged once each

    def plan(self, declared: Sequence[Declaration]) -> Plan:
        return plan(declared, self._deployer.all())

    async def apply(self, declared: Sequence[Declaration]) -> Plan:
        """Apply what can be applied now; returns the plan this round started from (raises the
        file's ``DeclarationError`` before anything is done when the plan cannot be made)."""
        todo = self.plan(declared)
        for removal in todo.removed:  # first: a removed one's names may be a new one's
            await self._step(removal.name, self._remove(removal))
        for change in todo.changed:
            await self._step(change.name, self._change(change))
        for creation in todo.created:
            await self._step(creation.declaration.name, self._create(creation))
        if todo.empty:
            self._said.clear()
        return todo

    async def _step(self, name: str, work: Awaitable[str | None]) -> None:
        """One deployment's step; what keeps it for a later round is said once, not each round."""
        try:
            waiting = await work
        except (DgxmmError, InsufficientMemory) as exc:
            waiting = f"not applied yet: {exc}"
        if waiting is not None and f"{name}: {waiting}" not in self._said:
            self._said.add(f"{name}: {waiting}")
            log.warning("declared deployment %s: %s", name, waiting)

    def _stop_if_idle(self, dep: Deployment, reason: str) -> Awaitable[bool]:
        return self._deployer.stop(dep.id, lambda now: not self._busy(now.id), actor=ACTOR, reason=reason)

    async def _remove(self, removal: Removal) -> str | None:
        dep = self._deployer.find(removal.id)
        if dep is None:
            return None
        if dep.state in (State.STARTING, State.STOPPING):
            return f"waits for its {dep.state.value} engine to settle before it is removed"
        if dep.state in (State.READY, State.ASLEEP) and not await self._stop_if_idle(dep, "removed from the config"):
            return "removed from the files: stopped once its requests end"
        await self._deployer.remove(dep.id, actor=ACTOR)
        log.info("declared deployment %s (id %s) removed", dep.name, dep.id)
        return None

    async def _change(self, change: Change) -> str | None:
        dep = self._deployer.find(change.id)
        if dep is None:
            return None
        new = change.new()
        settings = {key: value for key, value in new.items() if key not in (*MODE_FIELDS, "declared_in")}
        if change.restart:
            if dep.state in (State.STARTING, State.STOPPING):
                return f"waits for its {dep.state.value} engine to settle before it restarts"
            if not await self._stop_if_idle(dep, "restarting with its new settings from the config"):
                return "changed in the files: restarted once its requests end"
        if settings:
            self._deployer.reconfigure(change.id, settings, user=None, actor=ACTOR)
        if "declared_in" in new:
            self._deployer.move_declaration(change.id, new["declared_in"])
        if any(key in new for key in MODE_FIELDS):
            mode = Mode(new.get("mode", dep.effective_mode))
            await self._set_mode(change.id, mode, new.get("idle_timeout_s", dep.idle_timeout_s))
        log.info("declared deployment %s changed: %s", change.name, ", ".join(sorted(new)))
        now = self._deployer.get(change.id)
        if change.restart and now.effective_mode is Mode.ALWAYS_ON and now.state in (State.STOPPED, State.FAILED):
            self._deployer.restart(change.id, actor=ACTOR)  # an on-demand one: at its next request
        return None

    async def _create(self, creation: Creation) -> str | None:
        decl = creation.declaration
        fields = decl.fields
        dep = Deployment(id=creation.id, managed_by="config", declared_in=decl.file, **fields)
        made = self._deployer.create(dep, user=None, start=dep.effective_mode is Mode.ALWAYS_ON, actor=ACTOR)
        log.info("declared deployment %s created (id %s, %s)", made.name, made.id, decl.file)
        if made.preload and made.is_on_demand:
            self._preload([made.id])
        return None
