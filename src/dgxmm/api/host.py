"""``/api/host``, ``/api/events`` (Server-Sent Events), ``/api/events/history`` and ``/api/audit``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Query
from sse_starlette.sse import EventSourceResponse

from dgxmm import __version__
from dgxmm.api.auth import require_admin
from dgxmm.api.ports import Listing, Memory, listing_of, memory_of
from dgxmm.api.redact import all_for_reader, for_reader
from dgxmm.api.streams import event_stream
from dgxmm.context import ctx_of
from dgxmm.context import Context
from dgxmm.deploy.engines import ENGINES

router = APIRouter(tags=["host"])
# The event stream's first snapshot goes out in pieces of this many views, each built from one
# look at everything, with the event loop let go in between: with 2,000 deployments the whole
# snapshot in one go stalled the gateway for 3.4 s.
SNAPSHOT_PIECE = 50


@router.get("/host")
async def host(
    ctx: Context = Depends(ctx_of),
    deployments: Listing = Depends(listing_of),
    memory: Memory = Depends(memory_of),
    user: str = Depends(require_admin),
) -> dict[str, Any]:
    snap = memory.snapshot()
    settings = ctx.settings
    litellm_ready = ctx.litellm is not None and ctx.litellm.ready
    return {
        "role": "admin" if user == "admin" else "viewer",  # what the console offers: a viewer's only reads
        "version": __version__,
        "instance_id": ctx.instance_id,
        "started_at": ctx.started_at,
        "runtime": settings.runtime.kind,
        "memory": {
            "source": settings.memory.source,
            "usable_gib": round(snap.usable, 3),
            "capacity_gib": round(snap.capacity, 3),
            "held_gib": round(snap.held, 3),
            "fixed_gib": round(snap.fixed, 3),
            "free_gib": round(snap.free, 3),
            "pooled": memory.budget.pooled,
        },
        "devices": devices_view(memory),
        "deployments": len(deployments.all()),
        "ondemand": {
            "litellm_ready": litellm_ready,
            "idle_timeout_s": settings.ondemand.idle_timeout_s,
            "idle_timeout_min_s": settings.ondemand.idle_timeout_min_s,
            "idle_timeout_max_s": settings.ondemand.idle_timeout_max_s,
        },
        "engines": [kind.describe(settings.engines) for kind in ENGINES.values()],
        "litellm": {
            "enabled": settings.litellm.enabled,
            "ready": litellm_ready,
            "error": ctx.litellm.state.error if ctx.litellm is not None else None,
            "warm_first": settings.litellm.warm_first,
            "gateway_url": f"{settings.litellm.internal_url.rstrip('/')}/ondemand"
            if settings.litellm.enabled
            else None,
        },
        "router": {
            "enabled": settings.router.enabled,
            "path": settings.router.path,
            "ready": settings.router.enabled and ctx.keys.current() is not None,
        },
        "disk": ctx.models.disk(),  # the models directory: its free space, what the store holds
        "tasks": ctx.supervisor.health(),
        "server": server_view(ctx),
        "config": ctx.config_status(),
    }


def devices_view(memory: Memory) -> list[dict[str, Any]]:
    """Each device (one on a pooled host): its size, and what is free and held there now."""
    budget = memory.budget
    accounts = {account.index: account for account in memory.snapshot().devices}
    found = []
    for device in budget.devices():
        account = accounts.get(device.index)
        found.append(
            {
                "index": device.index,
                "name": device.name,
                "total_gib": round(device.total_gib, 3),
                "free_gib": None if account is None else round(account.free, 3),
                "held_gib": None if account is None else round(account.held, 3),
                "usable_gib": None if account is None else round(account.usable, 3),
                "capacity_gib": None if account is None else round(account.capacity, 3),
            }
        )
    return found


def server_view(ctx: Context) -> dict[str, Any]:
    """The HTTP server's limits and its connections now (see docs/server.md)."""
    limits = ctx.limits
    return {
        "max_connections": limits.max_connections,
        "admin_reserve": limits.admin_reserve,
        "gateway_share": limits.gateway_share,
        **ctx.connections.stats(),
    }


@router.get("/host/history")
async def host_history(ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)) -> dict[str, Any]:
    """Memory held by each deployment and wanted by queued ones over the last hour."""
    return ctx.history.host()


@router.get("/events")
async def events(
    ctx: Context = Depends(ctx_of), deployments: Listing = Depends(listing_of), user: str = Depends(require_admin)
) -> EventSourceResponse:
    """Live stream: first every deployment's view, then each change and event row as it happens."""
    sub = ctx.bus.subscribe()

    async def stream() -> AsyncIterator[dict[str, str]]:
        try:
            deps = deployments.all()
            for first in range(0, len(deps), SNAPSHOT_PIECE):
                for view in all_for_reader(user, ctx.views.of_all(deps[first : first + SNAPSHOT_PIECE])):
                    yield {"event": "deployment", "data": json.dumps(view)}
                await asyncio.sleep(0)  # the gateway's requests get the loop between pieces
            async for message in sub:
                data = for_reader(user, message.data) if message.kind == "deployment" else message.data
                yield {"event": message.kind, "data": json.dumps(data)}
        finally:
            sub.close()

    return event_stream(stream())


@router.get("/events/history")
async def event_history(
    limit: int = Query(200, ge=1, le=5000),
    deployment_id: str | None = None,
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> list[dict[str, Any]]:
    return ctx.store.list_events(limit, deployment_id)


@router.get("/audit")
async def audit(
    limit: int = Query(200, ge=1, le=5000),
    deployment_id: str | None = None,
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> list[dict[str, Any]]:
    return ctx.store.list_audit(limit, deployment_id)
