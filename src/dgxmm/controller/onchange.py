"""What a change of the ledger does to the controller's state: ``OnChange``.

The deployer tells the controller's state of each change (``ControllerState.hear``); the state
applies it at once, or after the decision under way, through this: its named writes for the
change (a track made or forgotten, a start ready or failed with its backoff, or one that ran out
of memory kept for its retry (oomretry.py), errors for the waiters of a removed or stopped
start), then the wake-ups the change concerns (its own waiters;
the queued starts' only when it holds, frees or takes memory: ``concerns_queue``). It never
decides or starts; a planned model whose files arrived is preloaded after the change has reached
every listener.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from dgxmm.controller import decide, oomretry
from dgxmm.controller.decide import OomRetry
from dgxmm.controller.effects import Report
from dgxmm.controller.errors import NoSuchDeployment, OndemandError, StartFailed, Stopped
from dgxmm.controller.state import ControllerState
from dgxmm.records.changes import Change
from dgxmm.records.deployment import HOLDS_MEMORY, State
from dgxmm.settings import OndemandSettings


def concerns_queue(change: Change) -> bool:
    """Whether a queued start may decide differently after ``change``: memory held, freed or
    taken (a state change to or from one that holds memory, its release, the config of an engine
    that holds memory, a removal of one). A preparation's progress, a wait at the start-up gate, a
    stopped model's edit: no queued start looks again for them."""
    dep = change.deployment
    if change.kind == "released":
        return True
    if change.kind == "state":
        return dep.holds_memory or change.old_state in HOLDS_MEMORY
    if change.kind in ("created", "config"):
        return dep.holds_memory
    if change.kind == "removed":
        return dep.holds_memory or change.old_state in HOLDS_MEMORY
    return False


class OnChange:
    def __init__(
        self, settings: OndemandSettings, report: Report, preload: Callable[[Collection[str]], object]
    ) -> None:
        self._settings = settings
        self._metrics = report
        self._preload = preload

    def __call__(self, state: ControllerState, change: Change) -> None:
        dep = change.deployment
        if change.kind == "created":
            state.created(dep)
        elif change.kind == "removed":
            error: OndemandError = (Stopped if change.old_state is State.STARTING else NoSuchDeployment)(
                f"deployment {dep.name} was removed"
            )
            state.fail_waiters(dep.id, error)
            state.forget(dep.id)
        elif change.kind == "config":
            state.reconfigured(dep, change.old)
        elif change.kind == "state":
            self._on_state(state, change)
        elif change.kind == "released" and state.track(dep.id).oom is OomRetry.ENDING:
            state.oom_retry(dep.id, OomRetry.DUE)  # its engine is gone: the retry may make room and start
        state.wake(dep.id)  # its waiters decide again
        if concerns_queue(change):
            state.wake_queued()  # memory held, freed or taken: queued starts look again
        if change.kind != "removed":
            state.touched(dep.id)

    def _on_state(self, state: ControllerState, change: Change) -> None:
        dep, old = change.deployment, change.old_state
        if dep.state is State.READY:
            state.became_ready(dep.id)
        elif old in (State.STARTING, State.PLANNED) and dep.state is State.FAILED:  # (planned: its files' fetch)
            track = state.track(dep.id)
            if old is State.STARTING and oomretry.after_failed_start(track, dep.state_reason) is OomRetry.ENDING:
                state.oom_retry(dep.id, OomRetry.ENDING)  # its waiters wait for the retry, no backoff
                return
            if track.started_for_request:
                self._metrics.start_failed(dep.id)
            o = self._settings
            state.start_failed(dep.id, decide.next_backoff(track.backoff_s, o.backoff_initial_s, o.backoff_max_s))
            reason = dep.state_reason.split("\n")[0]
            state.fail_waiters(dep.id, StartFailed(f"{dep.name} failed to start: {reason}"))
        elif old is State.STARTING and dep.state in (State.STOPPING, State.STOPPED):
            state.mark_started(dep.id, False)
            state.fail_waiters(dep.id, Stopped(f"{dep.name} was stopped while starting"))
        elif old is State.PLANNED and dep.state is State.STOPPED and dep.preload:
            # Its files are here: preloaded as at its create (after this change has reached every listener).
            asyncio.get_running_loop().call_soon(self._preload, [dep.id])
