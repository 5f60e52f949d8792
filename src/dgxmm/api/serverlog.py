"""``GET /api/log``: dgxmm's own latest log lines, newest first, filtered by level and by words
or a request id (telemetry/serverlog.py)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query

from dgxmm.context import ctx_of
from dgxmm.api.auth import require_admin
from dgxmm.context import Context

router = APIRouter(prefix="/log", tags=["log"])


@router.get("")
async def server_log(
    level: Literal["debug", "info", "warning", "error", "critical"] | None = Query(
        None, description="this level and above"
    ),
    q: str | None = Query(None, max_length=200, description="words or a request id, in the line or its fields"),
    limit: int = Query(200, ge=1, le=2000),
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> list[dict[str, Any]]:
    return ctx.server_log.query(limit, level, q)
