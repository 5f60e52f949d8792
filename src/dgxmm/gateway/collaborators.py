"""What the gateway calls of the rest of dgxmm, as Protocols: the deployer's records, the
controller's slots, and whoever watches the traffic (the history). The concrete classes are wired
in app.py; the type checker holds them to these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dgxmm.controller.slots import Slot
from dgxmm.records.deployment import Deployment


class TrafficObserver(Protocol):
    """Told of each traffic request and of each refusal of one (the history listens): the
    on-demand wait's, and an always-on model that is not ready; and of each such request's
    end, with what it cost and whether it ended with an error answer."""

    def request(self, deployment_id: str) -> None: ...

    def refused(self, deployment_id: str, code: str) -> None: ...

    def answered(self, deployment_id: str, prompt_tokens: int, completion_tokens: int, failed: bool) -> None: ...


class Records(Protocol):
    """The deployer, as the gateway reads it: a deployment's stored record (not a copy: the hot
    path reads it and never changes it)."""

    def peek(self, deployment_id: str) -> Deployment | None: ...


class Slots(Protocol):
    """The on-demand controller, as the gateway calls it: a slot per traffic request."""

    def try_slot(self, deployment_id: str) -> Slot | None:
        """A slot at once when the deployment is ready and its turn is free (no task, no
        waiting), else None."""

    async def acquire(
        self,
        deployment_id: str,
        on_queued: Callable[[], None] | None = None,
        arrival: float | None = None,
        request_id: str = "",
    ) -> Slot:
        """A slot, after a start, a make-room, the memory queue or its turn under the model's
        ``max_concurrent``; raises ``OndemandError`` (``ondemand_cancelled`` when an
        administrator cancelled the wait)."""
