"""``/api/waiting``: the requests waiting now for a slot (for memory, a start, their turn under a
model's ``max_concurrent``, a drain), on the host or of one deployment, and an administrator's
cancel of one (its caller gets 503 ``ondemand_cancelled``). What it calls of the controller and
the deployer it takes as Protocols (``Waiting``, ``DeploymentReader``, and the controller's own
``RecordPort`` for the event bus)."""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import APIRouter, Depends, Query

from dgxmm.api.auth import require_admin
from dgxmm.api.ports import reader_of
from dgxmm.context import Context, ctx_of
from dgxmm.controller.effects import RecordPort
from dgxmm.errors import NotFound
from dgxmm.records.deployment import DeploymentReader

router = APIRouter(tags=["waiting"])


class Waiting(Protocol):
    """The on-demand controller, as this API calls it."""

    def waiting(self, deployment_id: str | None = None) -> list[dict[str, Any]]:
        """The requests waiting now, oldest first."""

    def cancel(self, waiter_id: str) -> str | None:
        """End a waiting request with 503 ondemand_cancelled; its deployment's id, or None."""


@router.get("/waiting")
async def waiting_now(
    deployment: str | None = Query(None, max_length=64, description="only this deployment's"),
    ctx: Context = Depends(ctx_of),
    deployments: DeploymentReader = Depends(reader_of),
    user: str = Depends(require_admin),
) -> list[dict[str, Any]]:
    """Every request waiting now, oldest first (or one deployment's)."""
    return listed(ctx.ondemand, deployments, deployment)


@router.get("/deployments/{deployment_id}/waiting")
async def waiting_of(
    deployment_id: str,
    ctx: Context = Depends(ctx_of),
    deployments: DeploymentReader = Depends(reader_of),
    user: str = Depends(require_admin),
) -> list[dict[str, Any]]:
    """The requests waiting now for this deployment, in arrival order (404 for no deployment)."""
    return listed(ctx.ondemand, deployments, deployment_id)


@router.post("/waiting/{waiter_id}/cancel")
async def cancel(
    waiter_id: str,
    ctx: Context = Depends(ctx_of),
    deployments: DeploymentReader = Depends(reader_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    return cancelled(ctx.ondemand, deployments, ctx.bus, waiter_id, user)


def listed(controller: Waiting, records: DeploymentReader, deployment_id: str | None) -> list[dict[str, Any]]:
    if deployment_id is not None:
        records.get(deployment_id)  # NotFound: 404
    return controller.waiting(deployment_id)


def cancelled(
    controller: Waiting, records: DeploymentReader, bus: RecordPort, waiter_id: str, user: str
) -> dict[str, Any]:
    """Cancel the waiting request ``waiter_id`` (an ``id`` of the list): 404 when none of that
    id waits (unknown, served, refused or gone already). Audited, and an event of its deployment."""
    row = next((r for r in controller.waiting() if r["id"] == waiter_id), None)
    deployment_id = controller.cancel(waiter_id) if row is not None else None
    if row is None or deployment_id is None:
        raise NotFound(f"no request {waiter_id[:64]!r} is waiting (unknown, or served already)")
    text = f"Cancelled a request waiting for {row['waits_for']} (request id {row['request_id']})"
    bus.event("api", deployment_id, text)
    bus.audit("cancel_request", actor="api", user=user, deployment_id=deployment_id, old=row, text=text)
    return {"cancelled": row}
