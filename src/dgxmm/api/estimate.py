"""``POST /api/estimate``: what llama.cpp's server will hold for a GGUF model on this host, before
its first start (``deploy/estimate.py``); the deploy wizard proposes it as ``memory_gib``.

``model`` may also be a hub name (``hf://ORG/REPO[@REV]/PATH``) whose file the model store has
pulled: its local file is read.

The path may name any file a local user put in a shared folder (issue 34), so the header is read
off the event loop, within the bounds of ``deploy/ggufheader.py`` (which ends its own read at its
deadline), and at most ``MAX_RUNNING`` reads run at once: a file on a disk that hangs holds a
thread until its read returns, and more of them are refused 503 rather than given more threads.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from dgxmm.api.auth import require_admin
from dgxmm.context import ctx_of
from dgxmm.context import Context
from dgxmm.deploy.estimate import MAX_CONTEXT, Estimate, estimate
from dgxmm.deploy.ggufheader import NotAModel
from dgxmm.deploy.ggufheader import DEADLINE_S
from dgxmm.errors import DgxmmError, InvalidInput
from dgxmm.records.deployment import HUB_SCHEME

router = APIRouter(tags=["estimate"])
MAX_RUNNING = 2  # header reads at once (each takes milliseconds for a real model)
_running = 0  # read and written on the event loop's thread only


class EstimatesBusy(DgxmmError):
    status = 503
    code = "server_busy"


class EstimateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=1000)
    ctx: int | None = Field(None, ge=1, le=MAX_CONTEXT)


@router.post("/estimate")
async def estimate_model(
    body: EstimateRequest, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> dict[str, Any]:
    """The estimate for the GGUF at ``model`` (a path on this host, or a pulled hub name)
    started with ``args``."""
    global _running
    path = body.model
    if path.startswith(HUB_SCHEME):
        local = ctx.models.readiness_of(path).path
        if local is None:
            raise InvalidInput(f"model: {path}: its file is not pulled yet (POST /api/models)", field="model")
        path = local
    if _running >= MAX_RUNNING:
        raise EstimatesBusy(f"{MAX_RUNNING} estimates are reading their files already; try again")
    _running += 1
    reading = asyncio.ensure_future(asyncio.to_thread(estimate, Path(path), body.args, body.ctx))
    reading.add_done_callback(_done)
    try:
        found: Estimate = await asyncio.wait_for(asyncio.shield(reading), DEADLINE_S + 1)
    except NotAModel as exc:
        raise InvalidInput(f"model: {exc}", field="model") from None
    except TimeoutError:
        raise InvalidInput(
            f"model: {body.model}: its header was not read within {DEADLINE_S + 1:g} s", field="model"
        ) from None
    return found.as_dict()


def _done(reading: asyncio.Future[Estimate]) -> None:
    """The end of a read (on the loop's thread), even one whose request gave up waiting."""
    global _running
    _running -= 1
    if not reading.cancelled():
        reading.exception()  # retrieved: a read nobody waits for any more does not log its refusal
