"""``/api/deployments``: create, list, read, start, stop, sleep, wake, remove, logs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from dgxmm.api.auth import require_admin
from dgxmm.api.schemas import Action, DeploymentCreate, LogTail, ModeChange
from dgxmm.context import Context
from dgxmm.deploy.models import Deployment, Mode
from dgxmm.errors import InvalidInput

router = APIRouter(prefix="/deployments", tags=["deployments"])


def ctx_of(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


def check_idle_timeout(ctx: Context, value: float | None) -> None:
    low = ctx.settings.ondemand.idle_timeout_min_s
    high = ctx.settings.ondemand.idle_timeout_max_s
    if value is not None and not low <= value <= high:
        raise InvalidInput(
            f"idle_timeout_s: must be between {low:g} and {high:g} s", field="idle_timeout_s"
        )


@router.get("")
def list_deployments(ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)) -> list[dict[str, Any]]:
    return [ctx.view(dep) for dep in ctx.deployer.all()]


@router.post("", status_code=201)
async def create_deployment(
    body: DeploymentCreate, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> JSONResponse:
    """A new on-demand deployment is stopped (its first request starts it); a new always-on one
    is started at once, and is not created at all when it does not fit."""
    check_idle_timeout(ctx, body.idle_timeout_s)
    data = body.model_dump()
    data["served_name"] = body.served_name or body.name
    dep = await ctx.deployer.create(
        Deployment(id="", **data), user=user, start=body.mode is Mode.ALWAYS_ON
    )
    return JSONResponse(ctx.view(dep), status_code=201)


@router.get("/{deployment_id}")
def get_deployment(
    deployment_id: str, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> dict[str, Any]:
    return ctx.view(ctx.deployer.get(deployment_id))


@router.delete("/{deployment_id}")
async def remove_deployment(
    deployment_id: str, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> dict[str, Any]:
    await ctx.deployer.remove(deployment_id, actor="api", user=user)
    return {"removed": deployment_id}


@router.post("/{deployment_id}/{action}")
async def act(
    deployment_id: str,
    action: Action,
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    """Start and wake return once the engine is starting; stop returns once it is stopped."""
    deployer = ctx.deployer
    old = deployer.get(deployment_id)
    if action == "start":
        await deployer.restart(deployment_id, actor="api", user=user)
    elif action == "wake":
        await deployer.wake(deployment_id, actor="api", user=user)
    elif action == "sleep":
        await deployer.sleep(deployment_id, actor="api", user=user)
    else:
        await deployer.stop(deployment_id, actor="api", user=user)
    ctx.bus.audit(action, actor="api", user=user, deployment_id=deployment_id,
                  old={"state": old.state.value},
                  new={"state": deployer.get(deployment_id).state.value})  # fmt: skip
    return ctx.view(deployer.get(deployment_id))


@router.get("/{deployment_id}/logs")
async def logs(
    deployment_id: str,
    tail: int = Query(100, ge=1, le=10000),
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> LogTail:
    return LogTail(lines=await ctx.deployer.logs(deployment_id, tail))


@router.patch("/{deployment_id}/mode")
async def set_mode(
    deployment_id: str,
    body: ModeChange,
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    """Switch between always on and on demand. A stopped, failed or asleep deployment switched
    to always on is started first and shows ``pending_mode`` until it is ready."""
    check_idle_timeout(ctx, body.idle_timeout_s)
    dep = await ctx.ondemand.set_mode(deployment_id, body.mode, body.idle_timeout_s, user=user)
    return ctx.view(dep)
