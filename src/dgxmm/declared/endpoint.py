"""``GET /api/config/plan``: what applying the declared files as they are now would do, the
answer ``dgxmm check-config`` prints (for the console and for a check-config on a live host)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from dgxmm.api.auth import require_admin
from dgxmm.declared.watch import Declared

router = APIRouter(tags=["config"])


@router.get("/config/plan")
async def config_plan(request: Request, user: str = Depends(require_admin)) -> dict[str, Any]:
    """``valid`` and, when the files are valid, ``plan`` (created, changed with their fields,
    restarted, removed, unchanged); else ``error`` (file, line, table, name, field, message)."""
    declared: Declared = request.app.state.declared
    return await declared.plan_now()
