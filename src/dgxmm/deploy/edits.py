"""A deployment's settings as an operator changes them: the checks before the ledger's writes.

Each is a plain call, checked and written with no ``await`` (the deployer's lock, deployer.py),
and heard by the listeners as a ``config`` or ``state`` change:

- ``reconfigure``: an operator's edit (the admin API's ``PATCH``, a declared file's change) of a
  deployment whose engine is not running, but for the fields its engine does not see; written
  by the ledger's ``edit``;
- ``reset_after_edit``: a failed deployment whose settings were edited is stopped, to be started
  again (its failure was the old settings').

The controller's mode switch (``switch_mode``, ``pend_mode``) and a declaration's move
(``move_declaration``) are the ledger's own named writes, which the deployer hands on. Nothing
outside ``deploy/`` calls a write of the ledger (tests/unit/test_record_writers.py): a part that
changes a deployment asks the deployer for an operation that says what it does.
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
from dgxmm.records.deployment import State

# What a running deployment's settings may change: what its engine does not see (the names the
# model router knows it by besides the served name; whether dgxmm preloads it; how many requests
# it lets run on the engine at once, which the controller applies to the next release or arrival;
# the request parameters the gateway applies to the next request's body; what Ollama's clients
# are told it can do).
CHANGES_WHILE_RUNNING = frozenset(
    {"aliases", "preload", "max_concurrent", "request_defaults", "request_overrides", "strip_params", "capabilities"}
)
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
    ) -> None:
        self._ledger = ledger
        self._bus = bus
        self._budget = budget
        self._limits = limits
        self._removing = removing  # whether a deployment is being removed

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
        self._ledger.edit(deployment_id, {**changes, **derived})
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
            self._ledger.mark_stopped(deployment_id, EDITED_AFTER_FAILURE)
