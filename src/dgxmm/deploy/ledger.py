"""The deployer's records: the stored deployments, their names, and the named writes that change them.

A deployment record changes only through one of the ledger's named writes, each of which says
what happened and checks that it may: ``mark_starting``, ``mark_waking``, ``mark_ready``,
``mark_asleep``, ``mark_stopping``, ``mark_stopped``, ``mark_failed`` and ``mark_planned`` move
the state along the state machine (``InvalidTransition`` otherwise); ``declare_stopped`` records
an engine known gone whatever the record said (dgxmm restarted or is exiting); ``set_handle``,
``set_model_path``, ``set_memory_limit`` and ``set_reason`` record what the deployer learnt;
``edit``, ``switch_mode``, ``pend_mode`` and ``move_declaration`` change settings. There is no
write of any field by name: each of these makes a new frozen record (``model_copy(update=...)``)
through ``_write``, stores it, holds it in the old one's place and claims its names.

The ledger lives in deploy/ and only deploy/'s parts hold it (each through a Protocol that names
the writes it makes: ``StartWrites``, ``EndingWrites``, ``PreparationWrites``); the rest of dgxmm
asks the ``Deployer`` for an operation it checks (tests/unit/test_record_writers.py). Readers are
handed the held records themselves: a frozen record cannot be changed, so none needs a copy.
Listeners hear a change through ``notify``, after it is stored. The deployer decides what changes
and when (its check-and-write calls); this module keeps the records and the writing rule.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dgxmm.deploy.names import Names
from dgxmm.errors import NotFound, StoreUnavailable
from dgxmm.logs import fields
from dgxmm.onethread import Owner
from dgxmm.records.changes import Change, Listener
from dgxmm.records.deployment import (
    Deployment,
    InvalidTransition,
    MemoryLimit,
    Mode,
    RuntimeHandle,
    State,
    can_transition,
)
from dgxmm.store.db import Store

log = logging.getLogger("dgxmm.deploy.deployer")  # (the state changes' log lines, as before the split)


class Ledger:
    def __init__(self, store: Store) -> None:
        self._owner = Owner("deployer")
        self._store = store
        self.records: dict[str, Deployment] = {dep.id: dep for dep in store.load_deployments()}
        self.names = Names()  # served names and aliases: the model router's lookup
        for dep in self.records.values():  # oldest first: a name two of them hold stays the older one's
            for name in self.names.claim(dep):
                log.warning(
                    "the name %r of %s (id %s) is another deployment's too: the model router finds "
                    "the older one; give one of them another name",
                    name,
                    dep.name,
                    dep.id,
                )
        self.listeners: list[Listener] = []

    # --- reading ------------------------------------------------------------------------------

    def peek(self, deployment_id: str) -> Deployment | None:
        return self.records.get(deployment_id)

    def all(self) -> list[Deployment]:
        return list(self.records.values())

    def name_of(self, deployment_id: str) -> str:
        dep = self.records.get(deployment_id)
        return dep.name if dep is not None else deployment_id

    def require(self, deployment_id: str) -> Deployment:
        dep = self.records.get(deployment_id)
        if dep is None:
            raise NotFound(f"no deployment {deployment_id}")
        return dep

    def require_writable(self) -> None:
        """A change a caller asks for is refused while the database cannot be written."""
        if not self._store.flush():
            raise StoreUnavailable(self._store.problem or "the database cannot be written")

    # --- telling the listeners ----------------------------------------------------------------

    def notify(self, change: Change) -> None:
        self._owner.check()
        for listener in self.listeners:
            try:
                listener(change)
            except Exception:
                log.exception("deployment listener %r failed", listener)

    def released(self, deployment_id: str) -> None:
        """A failed deployment's engine is gone (``Ending``): listeners hear that its memory is free."""
        dep = self.records.get(deployment_id)
        if dep is not None:
            self.notify(Change("released", dep))

    def gated(self, deployment_id: str) -> None:
        """A start began or stopped waiting at the start-up gate (``Starts``): listeners hear it."""
        dep = self.records.get(deployment_id)
        if dep is not None:
            self.notify(Change("gate", dep))

    # --- the state: along the state machine ---------------------------------------------------

    def mark_starting(self, deployment_id: str, placed: list[int] | None) -> Deployment:
        """A start of a stopped, failed or planned deployment, on the devices ``placed``."""
        return self._move(deployment_id, State.STARTING, "starting", placed=placed)

    def mark_waking(self, deployment_id: str) -> Deployment:
        """A wake of an asleep engine: starting where it slept (``placed_on`` kept)."""
        return self._move(deployment_id, State.STARTING, "waking", require=State.ASLEEP)

    def mark_ready(
        self, deployment_id: str, reason: str = "", *, handle: RuntimeHandle | None = None, keep: bool = True
    ) -> Deployment:
        """The engine serves (a start's end, an adoption with its ``handle``, a refused sleep).
        Without ``keep``, a database that cannot be written raises ``StoreUnavailable`` and the
        state is unchanged."""
        return self._move(deployment_id, State.READY, reason, handle=handle, keep=keep)

    def mark_asleep(self, deployment_id: str) -> Deployment:
        return self._move(deployment_id, State.ASLEEP, "")

    def mark_stopping(self, deployment_id: str, reason: str) -> Deployment:
        return self._move(deployment_id, State.STOPPING, reason)

    def mark_stopped(self, deployment_id: str, reason: str = "") -> Deployment:
        """Stopped along the state machine: an engine's stop done, a planned deployment whose
        files are here, a failed one whose settings were edited."""
        return self._move(deployment_id, State.STOPPED, reason)

    def mark_failed(self, deployment_id: str, reason: str) -> Deployment:
        return self._move(deployment_id, State.FAILED, reason)

    def mark_planned(self, deployment_id: str, reason: str) -> Deployment:
        """Its model's files are to be fetched first (``reason``: what it waits for)."""
        return self._move(deployment_id, State.PLANNED, reason)

    def declare_stopped(self, deployment_id: str, reason: str) -> Deployment:
        """Stopped whatever the record said: its engine is known gone (dgxmm restarted, or is
        exiting, or a start was refused after the record moved) and no state may claim it."""
        return self._move(deployment_id, State.STOPPED, reason, check=False)

    def _move(
        self,
        deployment_id: str,
        state: State,
        reason: str,
        *,
        check: bool = True,
        require: State | None = None,
        handle: RuntimeHandle | None = None,
        keep: bool = True,
        placed: list[int] | None = None,
    ) -> Deployment:
        """The state change every ``mark_*`` makes: checked against the state machine (and
        ``require``, the one state it may come from), with ``pending_mode`` applied when the
        engine settles, written, logged and heard as a ``state`` change."""
        current = self.require(deployment_id)
        old_state = current.state
        if check and (not can_transition(old_state, state) or (require is not None and old_state is not require)):
            raise InvalidTransition(deployment_id, old_state, state)
        changes: dict[str, Any] = {"state": state, "state_reason": reason, "state_changed_at": time.time()}
        if handle is not None:
            changes["runtime_handle"] = handle
        if state is State.STARTING and old_state is not State.ASLEEP:
            changes["placed_on"] = placed  # where this start runs (a wake keeps where it slept)
        if state in (State.READY, State.FAILED, State.STOPPED) and current.pending_mode is not None:
            changes["mode"], changes["pending_mode"] = current.pending_mode, None
        dep = self._write(current, keep=keep, **changes)
        log.info(
            "%s: %s -> %s %s",
            deployment_id,
            old_state,
            state,
            reason.split("\n")[0],
            extra=fields(deployment_id, dep.served_name),
        )
        self.notify(Change("state", dep, old_state=old_state))
        return dep

    # --- what the deployer learnt -------------------------------------------------------------

    def set_handle(self, deployment_id: str, handle: RuntimeHandle) -> None:
        """Where a launched (or adopted) engine is, written at once (a dgxmm restart finds it
        there); not a change listeners hear (the change to ready follows, or it is adopted)."""
        self._write(self.require(deployment_id), runtime_handle=handle)

    def set_model_path(self, deployment_id: str, path: str | None, memory_limit: MemoryLimit | None) -> Deployment:
        """A hub model's files are here at ``path`` (None: they are not, or went), with the
        memory limit the engine is launched with on them."""
        return self._configure(deployment_id, model_path=path, memory_limit=memory_limit)

    def set_memory_limit(self, deployment_id: str, limit: MemoryLimit | None) -> Deployment:
        """The memory limit worked out again at a start (the files or the device may have changed)."""
        return self._configure(deployment_id, memory_limit=limit)

    def set_reason(self, deployment_id: str, reason: str) -> None:
        """A planned deployment's preparation moved on: its new reason, written, and heard by
        listeners as ``progress`` (nothing for a deployment no longer planned)."""
        dep = self.require(deployment_id)
        if dep.state is State.PLANNED and dep.state_reason != reason:
            self.notify(Change("progress", self._write(dep, state_reason=reason)))

    # --- settings -----------------------------------------------------------------------------

    def edit(self, deployment_id: str, changes: dict[str, Any]) -> Deployment:
        """An operator's edit, checked by its caller (``Edits.reconfigure``): settings only,
        never the state; ``StoreUnavailable`` if the database cannot be written."""
        return self._configure(deployment_id, **changes)

    def switch_mode(self, deployment_id: str, mode: Mode, idle_timeout_s: float | None) -> None:
        """The controller's mode switch, in force now: any pending switch is dropped."""
        self._configure(deployment_id, mode=mode, idle_timeout_s=idle_timeout_s, pending_mode=None)

    def pend_mode(self, deployment_id: str, pending: Mode | None, idle_timeout_s: float | None) -> None:
        """A mode switch applied when the engine settles (ready, failed or stopped: ``_move``
        applies it in the same write), or none (``pending`` None)."""
        self._configure(deployment_id, pending_mode=pending, idle_timeout_s=idle_timeout_s)

    def move_declaration(self, deployment_id: str, declared_in: str) -> None:
        """The declared deployment is now declared in another file."""
        self._configure(deployment_id, declared_in=declared_in)

    def _configure(self, deployment_id: str, **changes: Any) -> Deployment:
        """A change of settings (the values checked, as at a create), heard as ``config``;
        ``StoreUnavailable`` if the database cannot be written."""
        old = self.require(deployment_id)
        dep = Deployment.model_validate({**old.model_dump(), **changes})
        dep = self._write(dep, keep=False)
        self.notify(Change("config", dep, old=old))
        return dep

    # --- storing ------------------------------------------------------------------------------

    def add(self, dep: Deployment) -> Deployment:
        """A new record (``Deployer.create``, checked there), stored or ``StoreUnavailable``."""
        return self._write(dep, keep=False)

    def _write(self, dep: Deployment, *, keep: bool = True, **changes: Any) -> Deployment:
        """Store ``dep`` with ``changes`` as a new record, then hold it in the old one's place
        and return it. ``keep``: what happened to an engine is held whatever the disk does (the
        store writes it once it can); without, a database that cannot be written raises
        ``StoreUnavailable`` and nothing changes."""
        self._owner.check()
        dep = dep.model_copy(update={**changes, "updated_at": time.time()})
        self._store.put(dep, keep=keep)
        self.records[dep.id] = dep
        self.names.claim(dep)
        return dep

    def forget(self, deployment_id: str) -> Deployment:
        """Delete the record (``StoreUnavailable``: it is kept) and release its names."""
        self._store.delete(deployment_id)
        gone = self.records.pop(deployment_id)
        self.names.release(deployment_id)
        return gone
