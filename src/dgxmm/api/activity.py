"""``GET /api/activity``: the activity log of gateway requests, newest first, with filters;
``GET /api/activity/stream``, each new record as it is made (telemetry/activity.py); and
``GET /api/activity/refused``, the summary of requests refused before they showed a valid key
(telemetry/refusals.py), which the log does not hold one by one; ``GET /api/activity/usage``,
what the requests cost per model and per caller key, today and in the last hour."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Query
from sse_starlette.sse import EventSourceResponse

from dgxmm.api.auth import require_admin
from dgxmm.api.ports import Listing, listing_of
from dgxmm.api.streams import event_stream
from dgxmm.context import Context, ctx_of

router = APIRouter(prefix="/activity", tags=["activity"])


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


@router.get("/usage")
async def usage(
    ctx: Context = Depends(ctx_of), deployments: Listing = Depends(listing_of), user: str = Depends(require_admin)
) -> dict[str, Any]:
    """Requests, prompt and completion tokens and errors today (UTC) and in the last hour: per
    deployment (the history's, status/history.py) and per caller key, the key file's first
    (gateway/callerkeys.py). What is kept in memory is counted from ``counted_since``: the last
    hour, the models' figures and the key file's; a caller key's today and total outlive a restart."""
    by_id = ctx.history.usage()
    nothing = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "errors": 0}
    return {
        "counted_since": ctx.history.since,
        "models": [
            {
                "deployment_id": dep.id,
                "name": dep.name,
                "served_name": dep.served_name,
                **by_id.get(dep.id, {"today": nothing, "last_hour": nothing}),
            }
            for dep in sorted(deployments.all(), key=lambda d: d.name)
        ],
        "keys": ctx.callers.usage(),
    }


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
