"""What the gateway calls of the rest of dgxmm, as Protocols: the deployer's records, the
controller's slots and its status of a deployment (the status pages read that one too),
whoever watches the traffic (the history), and the live status a wait's progress lines word. The concrete classes are wired in app.py; the type
checker holds them to these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from dgxmm.controller.slots import Slot
from dgxmm.records.deployment import Deployment


class TrafficObserver(Protocol):
    """Told of each traffic request and of each refusal of one (the history listens): the
    on-demand wait's, and an always-on model that is not ready; and of each such request's
    end, with what it cost and whether it ended with an error answer."""

    def request(self, deployment_id: str) -> None: ...

    def refused(self, deployment_id: str, code: str) -> None: ...

    def answered(self, deployment_id: str, prompt_tokens: int, completion_tokens: int, failed: bool) -> None: ...


class Audit(Protocol):
    """The event bus, as the gateway writes audit rows: a caller's load or unload of a model
    (llama.cpp's ``/models/load`` and ``/models/unload``, llama-swap's unload, Ollama's empty
    prompt), with the caller key's name as the row's user."""

    def audit(
        self,
        action: str,
        *,
        actor: str,
        user: str | None,
        deployment_id: str | None,
        old: Any = None,
        new: Any = None,
        text: str = "",
    ) -> None: ...


class DeploymentPeek(Protocol):
    """The deployer, as the gateway reads it: a deployment's stored record (not a copy: the hot
    path reads it and never changes it)."""

    def peek(self, deployment_id: str) -> Deployment | None: ...


class OndemandStatus(Protocol):
    """The on-demand controller, as the router and the status pages read it."""

    def status(self, deployment_id: str) -> dict[str, Any]:
        """The controller's status of an on-demand deployment (its ``ondemand`` field)."""


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
        priority: int = 0,
    ) -> Slot:
        """A slot, after a start, a make-room, the memory queue or its turn under the model's
        ``max_concurrent``; raises ``OndemandError`` (``ondemand_cancelled`` when an
        administrator cancelled the wait)."""

    async def unload(self, deployment_id: str) -> bool:
        """Stop a ready on-demand deployment with nothing in flight and nobody waiting (a
        caller's ``keep_alive: 0`` on the Ollama API); True once stopped, False when busy."""

    def keep_alive(self, deployment_id: str, seconds: float) -> None:
        """The caller holding a slot of ``deployment_id`` asked it to stay ``seconds`` once idle
        (Ollama's ``keep_alive``; negative: as long as may be)."""


class WaitStatus(Protocol):
    """The live status (``status.live.LiveStatus``), as a wait's progress lines read it
    (progress.py)."""

    def status(self, dep: Deployment) -> dict[str, Any]:
        """``dep``'s honest status now (docs/api.md, "The deployment view", ``status``)."""
