"""A deployment as the admin API and its event stream show it: the record, its effective mode,
its engine's address while it runs, the controller's on-demand status, the LiteLLM status, the
honest status (``status.live``), the command line it runs with, the memory its engine was
measured at and the prefetch of its model's files while its start waits (docs/api.md, "The
deployment view"). ``Views`` reads each part from its owner through the narrow protocols below."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dgxmm.deploy.cmdline import command_line
from dgxmm.gateway.collaborators import OndemandStatus
from dgxmm.records.deployment import Deployment
from dgxmm.settings import Settings


class HonestStatus(Protocol):
    def status(self, dep: Deployment) -> dict[str, Any]:
        """The one status a page shows (its ``status`` field)."""

    def statuses(self, deps: Sequence[Deployment]) -> dict[str, dict[str, Any]]:
        """The statuses of many, by id, from one look at everything."""


class Measured(Protocol):
    def gib(self, deployment_id: str) -> float | None:
        """What its engine holds, measured; None while nothing runs or before the first reading."""

    def peak_gib(self, deployment_id: str) -> float | None:
        """The most its engine held since it started."""

    def suggested_gib(self, dep: Deployment) -> float | None:
        """The ``memory_gib`` to declare, from its highest measured run of this configuration."""


class Speeds(Protocol):
    def tokens_per_s(self, deployment_id: str) -> float | None:
        """Its recent generation speed (the activity log's), None before an answer said."""


class Prefetching(Protocol):
    def progress(self, deployment_id: str) -> tuple[int, int] | None:
        """Bytes read and the total of its model's files while they are prefetched, else None."""


class Registration(Protocol):
    def status(self, deployment_id: str) -> dict[str, Any] | None:
        """The deployment's LiteLLM entry: registered, pending, error (its ``litellm`` field)."""


class Views:
    def __init__(
        self,
        settings: Settings,
        controller: OndemandStatus,
        live: HonestStatus,
        litellm: Registration | None,
        measured: Measured | None = None,
        speeds: Speeds | None = None,
        prefetching: Prefetching | None = None,
    ) -> None:
        self._settings = settings
        self._controller = controller
        self._live = live
        self._litellm = litellm
        self._measured = measured
        self._speeds = speeds
        self._prefetching = prefetching

    def of(self, dep: Deployment) -> dict[str, Any]:
        return self._view(dep, self._live.status(dep))

    def of_all(self, deps: Sequence[Deployment]) -> list[dict[str, Any]]:
        """The views of ``deps``, in their order (one look at the budget and the controller)."""
        statuses = self._live.statuses(deps)
        return [self._view(dep, statuses[dep.id]) for dep in deps]

    def memory_of(self, dep: Deployment) -> dict[str, Any]:
        """The view's measured-memory fields alone: what a new reading changes (it goes out as
        a ``memory`` event, not a whole view, so it never carries counts of another moment)."""
        measured = self._measured
        now, peak = (measured.gib(dep.id), measured.peak_gib(dep.id)) if measured is not None else (None, None)
        return {
            "memory_measured_gib": None if now is None else round(now, 3),
            "memory_peak_gib": None if peak is None else round(peak, 3),
            "memory_suggested_gib": measured.suggested_gib(dep) if measured is not None else None,
        }

    def prefetch_of(self, dep: Deployment) -> dict[str, Any]:
        """The view's ``prefetch`` field alone: what a read's progress changes (it goes out as a
        ``prefetch`` event, at most about once a second, never as a whole view)."""
        progress = self._prefetching.progress(dep.id) if self._prefetching is not None else None
        if progress is None:
            return {"prefetch": None}
        done, total = progress
        return {"prefetch": {"bytes_done": done, "bytes_total": total}}

    def _view(self, dep: Deployment, status: dict[str, Any]) -> dict[str, Any]:
        data = dep.model_dump(mode="json", exclude={"runtime_handle", "mode", "placed_on"})
        data["mode"] = dep.effective_mode.value
        # The devices it holds memory on while it does, else its pins (``gpu_pins``), else null.
        data["gpu_pins"] = dep.gpu_ids
        data["gpu_ids"] = dep.placed_on if dep.holds_memory and dep.placed_on is not None else dep.gpu_ids
        data["base_url"] = dep.base_url
        data["ondemand"] = self._controller.status(dep.id) if dep.is_on_demand else None
        litellm = self._litellm.status(dep.id) if self._litellm is not None else None
        data["litellm"] = litellm or {"status": "disabled", "error": None}
        data["status"] = status
        data["command_line"] = command_line(dep, self._settings)
        data.update(self.memory_of(dep))
        data.update(self.prefetch_of(dep))
        data["tokens_per_s"] = self._speeds.tokens_per_s(dep.id) if self._speeds is not None else None
        return data
