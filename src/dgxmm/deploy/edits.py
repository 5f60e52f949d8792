"""A deployment's settings as they are changed: the named writes of its configuration.

Each is a plain call, checked and written with no ``await`` (the deployer's lock, deployer.py),
and heard by the listeners as a ``config`` change:

- ``reconfigure``: an operator's edit (the admin API's ``PATCH``, a declared file's change) of a
  deployment whose engine is not running, but for the fields its engine does not see;
- ``reset_after_edit``: a failed deployment whose settings were edited is stopped, to be started
  again (its failure was the old settings');
- ``switch_mode`` and ``pend_mode``: the controller's mode switch, now or once the engine settles;
- ``move_declaration``: the file that declares a deployment changed;
- ``update``: a field the deployer sets itself (a hub model's local path, the memory limit it
  resolved), for the deploy package's own parts (starts, preparation) alone.

Nothing outside ``deploy/`` calls ``update`` or ``Deployer.set_state``
(tests/unit/test_layers.py): a part that changes a deployment names what it does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dgxmm.deploy.auditing import audit_changes
from dgxmm.deploy.budget import MemoryBudget
from dgxmm.deploy.ledger import Ledger
from dgxmm.deploy.limits import EngineLimits
from dgxmm.errors import Conflict
from dgxmm.events import EventBus
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment, Mode, State

# What a running deployment's settings may change: what its engine does not see (the names the
# model router knows it by besides the served name; whether dgxmm preloads it; how many requests
# it lets run on the engine at once, which the controller applies to the next release or arrival).
CHANGES_WHILE_RUNNING = frozenset({"aliases", "preload", "max_concurrent"})
# The reason of a failed deployment an edit stopped (web/cards.js hides the old failure on it).
EDITED_AFTER_FAILURE = "Settings changed since the failed start"


class Edits:
    def __init__(
        self,
        ledger: Ledger,
        bus: EventBus,
        budget: MemoryBudget,
        limits: EngineLimits | None,
        removing: Callable[[str], bool],
        set_state: Callable[[str, State, str], Deployment],
    ) -> None:
        self._ledger = ledger
        self._bus = bus
        self._budget = budget
        self._limits = limits
        self._removing = removing  # whether a deployment is being removed
        self._set_state = set_state  # the deployer's state change (checked against the machine)

    def update(self, deployment_id: str, **changes: Any) -> Deployment:
        """Change configuration fields, not the state; ``StoreUnavailable`` if the database
        cannot be written."""
        old = self._ledger.require(deployment_id)
        dep = Deployment.model_validate({**old.model_dump(), **changes})  # (the values checked, as at a create)
        dep = self._ledger.write(dep, keep=False)
        self._ledger.notify(Change("config", dep, old=old))
        return dep

    def reconfigure(
        self, deployment_id: str, changes: dict[str, Any], *, user: str | None, actor: str = "api"
    ) -> dict[str, Any]:
        """Change settings of a deployment whose engine is not running (stopped, failed or
        planned): checked and written without an await, so no start can slip in between.
        ``changes`` holds only values that differ; the caller has validated the result.
        Returns the changes written (with those derived from them)."""
        dep = self._ledger.require(deployment_id)
        if self._removing(deployment_id) or (
            dep.state not in (State.STOPPED, State.FAILED, State.PLANNED) and set(changes) - CHANGES_WHILE_RUNNING
        ):
            raise Conflict(f"{dep.name} is {dep.state}: stop it before changing its settings")
        merged = self._budget.settled(dep.model_copy(update=changes))
        if merged.gpus != dep.gpus and "gpus" not in changes:  # set by the engine's parallel flags
            changes = {**changes, "gpus": merged.gpus}
        self._ledger.names.check(merged, self._ledger.name_of)
        name = changes.get("name")
        if name is not None and any(o.name == name for o in self._ledger.records.values() if o.id != deployment_id):
            raise Conflict(f"a deployment named {name!r} exists", field="name")
        old = {key: getattr(dep, key) for key in changes}
        derived: dict[str, Any] = {"model_path": None} if "model" in changes else {}
        if self._limits is not None:  # InvalidInput (422) before anything is written, as for a create
            derived["memory_limit"] = self._limits.resolve(dep.model_copy(update={**changes, **derived}))
        self.update(deployment_id, **changes, **derived)
        self._bus.audit(
            "update",
            actor=actor,
            user=user,
            deployment_id=deployment_id,
            old=audit_changes(old),
            new=audit_changes(changes),
        )
        self._bus.event(actor, deployment_id, f"Settings changed: {', '.join(sorted(changes))}")
        return changes

    def reset_after_edit(self, deployment_id: str) -> None:
        """A failed deployment whose settings were just edited is stopped: the card shows a
        deployment to start, not the old cause and log lines (issue 41 item 8)."""
        if self._ledger.require(deployment_id).state is State.FAILED:
            self._set_state(deployment_id, State.STOPPED, EDITED_AFTER_FAILURE)

    def switch_mode(self, deployment_id: str, mode: Mode, idle_timeout_s: float | None) -> None:
        """The controller's mode switch, in force now: any pending switch is dropped."""
        self.update(deployment_id, mode=mode, idle_timeout_s=idle_timeout_s, pending_mode=None)

    def pend_mode(self, deployment_id: str, pending: Mode | None, idle_timeout_s: float | None) -> None:
        """A mode switch applied when the engine settles (ready, failed or stopped: the deployer
        applies it in the same write), or none (``pending`` None)."""
        self.update(deployment_id, pending_mode=pending, idle_timeout_s=idle_timeout_s)

    def move_declaration(self, deployment_id: str, declared_in: str) -> None:
        """The declared deployment is now declared in another file."""
        self.update(deployment_id, declared_in=declared_in)
