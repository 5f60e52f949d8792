"""Switching a deployment between always on and on demand (``Controller.set_mode``).

A switch to always on of a stopped, failed or asleep deployment starts or wakes it in the same
plain call that sets ``pending_mode``, so no start attempt decides in between; the deployer
applies the mode with the state change. A switch resets the start-failure backoff.

``ModeSwitch`` owns no state: it changes records through the controller's ``Effects`` (its named
mode operations) and the controller's own state through ``Tracks`` (``ControllerState``
satisfies it), the two things the controller lets it do. A switch is a decision: the changes of
the ledger it makes are applied after it (``Tracks.deciding``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from dgxmm.controller.effects import Effects
from dgxmm.errors import InvalidInput, NotFound
from dgxmm.records.deployment import Deployment, Mode, Role, State


class Tracks(Protocol):
    """What a switch may change of the controller's own state."""

    def reset_backoff(self, deployment_id: str) -> None:
        """New starts are not refused any more (a switch is a fresh start)."""

    def restart_idle_timer(self, deployment_id: str) -> None:
        """The idle timer starts now (a deployment switched to on demand)."""

    def wake(self, deployment_id: str) -> None:
        """Wake the deployment's waiters: what they decide on changed."""

    def wake_queued(self) -> None:
        """Wake the queued deployments' waiters: a model may have become a victim, or not."""

    def deciding(self) -> AbstractContextManager[None]:
        """The switch runs inside: the ledger's changes it makes are applied after it."""


class ModeSwitch:
    def __init__(self, effects: Effects, tracks: Tracks) -> None:
        self._effects = effects
        self._tracks = tracks

    def set_mode(self, deployment_id: str, mode: Mode, idle_timeout_s: float | None, *, user: str | None) -> Deployment:
        with self._tracks.deciding():
            return self._switch(deployment_id, mode, idle_timeout_s, user)

    def _switch(self, deployment_id: str, mode: Mode, idle_timeout_s: float | None, user: str | None) -> Deployment:
        dep = self._effects.peek(deployment_id)
        if dep is None:
            raise NotFound(f"no deployment {deployment_id}")
        if dep.role is not Role.MODEL and mode is Mode.ON_DEMAND:
            raise InvalidInput(f"mode: a {dep.role} deployment is always always_on", field="mode")
        old = {"mode": dep.effective_mode.value, "idle_timeout_s": dep.idle_timeout_s}
        self._tracks.reset_backoff(deployment_id)
        if mode is Mode.ON_DEMAND:
            self._effects.switch_mode(deployment_id, mode, idle_timeout_s)
            self._tracks.restart_idle_timer(deployment_id)
        elif dep.effective_mode is Mode.ALWAYS_ON or dep.state in (State.READY, State.STOPPING, State.PLANNED):
            self._effects.switch_mode(deployment_id, mode, idle_timeout_s)
        elif dep.state is State.STARTING:
            self._effects.pend_mode(deployment_id, mode, idle_timeout_s)
        else:
            self._start_for_switch(dep, idle_timeout_s, user)
        new = self._effects.peek(deployment_id) or dep
        self._effects.audit(
            "ondemand_mode",
            actor="api",
            user=user,
            deployment_id=deployment_id,
            old=old,
            new={"mode": mode.value, "idle_timeout_s": new.idle_timeout_s, "pending_mode": new.pending_mode},
        )
        self._tracks.wake(deployment_id)
        self._tracks.wake_queued()
        return new

    def _start_for_switch(self, dep: Deployment, idle_timeout_s: float | None, user: str | None) -> None:
        """Stopped, failed or asleep: start or wake it first; it stays on demand with
        pending_mode always_on until the deployer applies the switch with the state change.
        One plain call, so no attempt decides in between."""
        self._effects.pend_mode(dep.id, Mode.ALWAYS_ON, idle_timeout_s)
        try:
            if dep.state is State.ASLEEP:
                self._effects.wake(dep.id, actor="api", user=user)
            else:
                self._effects.restart(dep.id, actor="api", user=user)
        except BaseException:  # a refused start leaves the deployment as it was
            if self._effects.peek(dep.id) is not None:
                self._effects.pend_mode(dep.id, None, dep.idle_timeout_s)
            raise
