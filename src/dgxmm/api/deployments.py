"""``/api/deployments``: create, list, read, change, start, stop, sleep, wake, remove, logs,
history, the kept compile cache."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse

from dgxmm.api.auth import require_admin
from dgxmm.api.ports import (
    CompileCaches,
    EngineLogs,
    Editor,
    Lifecycle,
    Listing,
    Sleeper,
    compile_caches_of,
    editor_of,
    lifecycle_of,
    listing_of,
    logs_of,
    sleeper_of,
)
from dgxmm.api.redact import all_for_reader, for_reader
from dgxmm.api.modelcheck import check_hub_model, check_model
from dgxmm.api.streams import event_stream
from dgxmm.api.schemas import Action, DeploymentCreate, DeploymentPatch, LogTail, ModeChange
from dgxmm.context import Context, ctx_of
from dgxmm.records.deployment import RUNNING, Deployment, Mode
from dgxmm.errors import Conflict, InvalidInput

router = APIRouter(prefix="/deployments", tags=["deployments"])


def check_idle_timeout(ctx: Context, value: float | None) -> None:
    """The seed's bounds, and 0: never stopped for idleness (make-room may still stop it)."""
    low = ctx.settings.ondemand.idle_timeout_min_s
    high = ctx.settings.ondemand.idle_timeout_max_s
    if value is not None and value != 0 and not low <= value <= high:
        raise InvalidInput(
            f"idle_timeout_s: must be 0 (never idle) or between {low:g} and {high:g} s", field="idle_timeout_s"
        )


class ManagedByConfig(Conflict):
    """An edit or removal of a deployment a file declares: its file is where it changes."""

    code = "managed_by_config"


def refuse_declared(dep: Deployment) -> None:
    """Start, stop, sleep and wake work on a declared deployment; its settings are its file's."""
    if dep.managed_by == "config":
        raise ManagedByConfig(
            f"{dep.name} is declared in {dep.declared_in}: change or remove it there (docs/configuration.md)"
        )


@router.get("")
async def list_deployments(
    ctx: Context = Depends(ctx_of), deployments: Listing = Depends(listing_of), user: str = Depends(require_admin)
) -> list[dict[str, Any]]:
    return all_for_reader(user, ctx.views.of_all(deployments.all()))


@router.post("", status_code=201)
async def create_deployment(
    body: DeploymentCreate,
    ctx: Context = Depends(ctx_of),
    editor: Editor = Depends(editor_of),
    deployments: Listing = Depends(listing_of),
    user: str = Depends(require_admin),
) -> JSONResponse:
    """A new on-demand deployment is stopped (its first request starts it), unless it is preloaded
    and fits as it is; a new always-on one is started at once, and is not created at all when it
    does not fit. One whose model a hub names (``hf://``) and is not pulled yet is planned while
    its files download, then becomes one of those (docs/models.md)."""
    check_idle_timeout(ctx, body.idle_timeout_s)
    await check_model(ctx.settings, body.engine, body.model)
    await check_hub_model(ctx.settings, ctx.models, body.engine, body.model, body.memory_gib)
    data = body.model_dump()
    data["served_name"] = body.served_name or body.name
    dep = editor.create(Deployment(id="", **data), user=user, start=body.mode is Mode.ALWAYS_ON)
    if dep.preload and dep.is_on_demand:
        ctx.ondemand.preload([dep.id])
    return JSONResponse(ctx.views.of(deployments.get(dep.id)), status_code=201)


@router.get("/{deployment_id}")
async def get_deployment(
    deployment_id: str,
    ctx: Context = Depends(ctx_of),
    deployments: Listing = Depends(listing_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    return for_reader(user, ctx.views.of(deployments.get(deployment_id)))


@router.patch("/{deployment_id}")
async def change_deployment(
    deployment_id: str,
    body: DeploymentPatch,
    ctx: Context = Depends(ctx_of),
    deployments: Listing = Depends(listing_of),
    editor: Editor = Depends(editor_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    """Change settings of a stopped or failed deployment. The changed record must pass the
    same checks as a create; only values that differ are written and audited (``update``)."""
    dep = deployments.get(deployment_id)
    refuse_declared(dep)
    given = body.model_dump(include=body.model_fields_set)
    current = dep.model_dump(include=set(DeploymentCreate.model_fields)) | {"mode": dep.effective_mode}
    merged = current | given
    if merged.get("served_name") is None:
        merged["served_name"] = merged.get("name")
    try:
        checked = DeploymentCreate.model_validate(merged).model_dump()
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    changes = {key: checked[key] for key in merged if key in given or key == "served_name"}
    changes = {key: value for key, value in changes.items() if value != current[key]}
    if changes.keys() & {"engine", "model"}:
        await check_model(ctx.settings, checked["engine"], checked["model"])
    if changes.keys() & {"engine", "model", "memory_gib"}:
        await check_hub_model(ctx.settings, ctx.models, checked["engine"], checked["model"], checked["memory_gib"])
    if changes:
        editor.reconfigure(deployment_id, changes, user=user)
        editor.reset_after_edit(deployment_id)  # the failure was the old settings'
    return ctx.views.of(deployments.get(deployment_id))


@router.delete("/{deployment_id}")
async def remove_deployment(
    deployment_id: str,
    deployments: Listing = Depends(listing_of),
    editor: Editor = Depends(editor_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    refuse_declared(deployments.get(deployment_id))
    await editor.remove(deployment_id, actor="api", user=user)
    return {"removed": deployment_id}


@router.post("/{deployment_id}/{action}")
async def act(
    deployment_id: str,
    action: Action,
    ctx: Context = Depends(ctx_of),
    deployments: Listing = Depends(listing_of),
    deployer: Lifecycle = Depends(lifecycle_of),
    sleeper: Sleeper = Depends(sleeper_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    """Start and wake return once the engine is starting; stop returns once it is stopped;
    sleep once it is asleep, after the requests in flight ended (409 if they do not in time)."""
    old = deployments.get(deployment_id)
    if action == "start":
        deployer.restart(deployment_id, actor="api", user=user)
    elif action == "wake":
        deployer.wake(deployment_id, actor="api", user=user)
    elif action == "sleep":
        await sleeper.sleep(deployment_id, actor="api", user=user)
    else:
        await deployer.stop(deployment_id, actor="api", user=user)
    ctx.bus.audit(
        action,
        actor="api",
        user=user,
        deployment_id=deployment_id,
        old={"state": old.state.value},
        new={"state": deployments.get(deployment_id).state.value},
    )
    return ctx.views.of(deployments.get(deployment_id))


@router.get("/{deployment_id}/logs")
async def logs(
    deployment_id: str,
    tail: int = Query(100, ge=1, le=10000),
    before: int | None = Query(
        None, ge=0, description="a log position (a request's engine_log_at): the lines up to it"
    ),
    engine_logs: EngineLogs = Depends(logs_of),
    user: str = Depends(require_admin),
) -> LogTail:
    return LogTail(lines=await engine_logs.logs(deployment_id, tail, before))


@router.get("/{deployment_id}/logs/follow")
async def follow_logs(
    deployment_id: str,
    tail: int = Query(100, ge=0, le=10000),
    deployments: Listing = Depends(listing_of),
    engine_logs: EngineLogs = Depends(logs_of),
    user: str = Depends(require_admin),
) -> EventSourceResponse:
    """Server-Sent Events: ``event: lines`` with the last ``tail`` lines, then with each batch
    of lines the engine writes, until the client leaves or the deployment is removed."""
    deployments.get(deployment_id)
    follow = engine_logs.follow_logs(deployment_id, tail)

    async def stream() -> AsyncIterator[dict[str, str]]:
        first = True
        async for lines in follow:
            if deployments.find(deployment_id) is None:
                return
            if lines or first:
                yield {"event": "lines", "data": json.dumps({"lines": lines})}
            first = False

    return event_stream(stream())


@router.get("/{deployment_id}/compile-cache")
async def compile_cache(
    deployment_id: str,
    deployments: Listing = Depends(listing_of),
    caches: CompileCaches = Depends(compile_caches_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    """Where the deployment's kept compile work is and its size; ``kept`` false for an engine
    whose compile work dgxmm does not keep (docs/engines.md#compile-cache)."""
    report = await caches.compile_cache(deployments.get(deployment_id))
    return {"kept": False} if report is None else {"kept": True, **report.view()}


@router.delete("/{deployment_id}/compile-cache")
async def clear_compile_cache(
    deployment_id: str,
    ctx: Context = Depends(ctx_of),
    deployments: Listing = Depends(listing_of),
    caches: CompileCaches = Depends(compile_caches_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    """Remove it, so that the next start compiles anew; 409 while the engine runs (it may be
    writing there)."""
    dep = deployments.get(deployment_id)
    if dep.state in RUNNING:
        raise Conflict(f"{dep.name} is {dep.state}: stop it before clearing its compile cache")
    before = await caches.compile_cache(dep)
    await caches.clear_compile_cache(deployment_id)
    freed = before.bytes if before is not None else 0
    ctx.bus.audit("compile_cache_cleared", actor="api", user=user, deployment_id=deployment_id, old={"bytes": freed})
    return {"cleared": deployment_id, "bytes": freed}


@router.get("/{deployment_id}/history")
async def history(
    deployment_id: str,
    ctx: Context = Depends(ctx_of),
    deployments: Listing = Depends(listing_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    """The last hour minute by minute and the latest starts (see dgxmm.status.history)."""
    deployments.get(deployment_id)
    return ctx.history.deployment(deployment_id)


@router.patch("/{deployment_id}/mode")
async def set_mode(
    deployment_id: str,
    body: ModeChange,
    ctx: Context = Depends(ctx_of),
    deployments: Listing = Depends(listing_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    """Switch between always on and on demand. A stopped, failed or asleep deployment switched
    to always on is started first and shows ``pending_mode`` until it is ready."""
    refuse_declared(deployments.get(deployment_id))
    check_idle_timeout(ctx, body.idle_timeout_s)
    dep = await ctx.ondemand.set_mode(deployment_id, body.mode, body.idle_timeout_s, user=user)
    return ctx.views.of(dep)
