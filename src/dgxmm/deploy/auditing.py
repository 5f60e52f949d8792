"""What the deployer writes of a change into audit rows and events: records without their
secrets, changed settings, where a start runs."""

from __future__ import annotations

from typing import Any, Protocol

from dgxmm.records.deployment import Deployment


class EventLog(Protocol):
    """Where the deployer's parts (starts, ending, preparation) write an event row: the bus."""

    def event(self, actor: str, deployment_id: str | None, text: str) -> object: ...


def started_on(placed: list[int] | None) -> str:
    """Where a start runs, for its event (nothing on a pooled host)."""
    if placed is None:
        return ""
    if not placed:
        return " (on no GPU)"
    return f" on device{'s' if len(placed) > 1 else ''} {', '.join(map(str, placed))}"


def audit_view(dep: Deployment) -> dict[str, Any]:
    """A created deployment as its audit row keeps it: no runtime handle, no reason, no ``env``
    (values may be secrets, and audit rows are kept for good)."""
    return dep.model_dump(mode="json", exclude={"runtime_handle", "state_reason", "env"})


def audit_changes(values: dict[str, Any]) -> dict[str, Any]:
    """Changed settings for an audit row; of ``env`` only the variable names (values may be
    secrets, and audit rows are kept for good)."""
    return {key: sorted(value) if key == "env" else value for key, value in values.items()}
