"""``GET /api/activity``: the activity log of gateway requests, newest first, with filters;
``GET /api/activity/stream``, each new record as it is made (telemetry/activity.py); and
``GET /api/activity/refused``, the summary of requests refused before they showed a valid key
(telemetry/refusals.py), which the log does not hold one by one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from sse_starlette.sse import EventSourceResponse

from dgxmm.api.auth import require_admin
from dgxmm.api.streams import event_stream
from dgxmm.context import Context

router = APIRouter(prefix="/activity", tags=["activity"])


async def ctx_of(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


@router.get("")
async def activity(
    deployment: str | None = Query(None, max_length=200, description="a deployment's id or served name"),
    status: int | None = Query(None, ge=0, le=999),
    since: float | None = Query(None, description="Unix time: records from then on"),
    key: str | None = Query(None, max_length=200, description='a caller key\'s name ("key-file": the key file)'),
    limit: int = Query(100, ge=1, le=10_000),
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> list[dict[str, Any]]:
    return ctx.activity.query(deployment, status, since, limit, key)


@router.get("/refused")
async def refused(ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)) -> dict[str, Any]:
    """Requests refused before a valid key (no key, a wrong one, the peer guard, the rate limit,
    the gateway's share), counted per peer and reason: the minute running now and the last ones."""
    return ctx.finish.refusals.report()


@router.get("/stream")
async def activity_stream(ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)) -> EventSourceResponse:
    """Each new record as an ``activity`` event (a console that falls far behind is dropped and
    reconnects, as on the main event stream)."""
    sub = ctx.activity_feed.subscribe()

    async def stream() -> AsyncIterator[dict[str, str]]:
        try:
            async for message in sub:
                yield {"event": "activity", "data": json.dumps(message.data)}
        finally:
            sub.close()

    return event_stream(stream())
