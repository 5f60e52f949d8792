"""``POST /api/estimate``: what llama.cpp's server will hold for a GGUF model on this host, before
its first start (``deploy/estimate.py``); the deploy wizard proposes it as ``memory_gib``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from dgxmm.api.auth import require_admin
from dgxmm.deploy.estimate import NotAModel, estimate
from dgxmm.errors import InvalidInput

router = APIRouter(tags=["estimate"])


class EstimateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=1000)
    ctx: int | None = Field(None, ge=1, le=1 << 24)


@router.post("/estimate")
async def estimate_model(body: EstimateRequest, user: str = Depends(require_admin)) -> dict[str, Any]:
    """The estimate for the GGUF at ``model`` (a path on this host) started with ``args``."""
    path = Path(body.model)
    if "\0" in body.model or not path.is_file():
        raise InvalidInput("model: not a file on this host (a GGUF path as llama-server opens it)", field="model")
    try:
        found = await asyncio.to_thread(estimate, path, body.args, body.ctx)  # reads the header only
    except NotAModel as exc:
        raise InvalidInput(f"model: {exc}", field="model") from None
    return found.as_dict()
