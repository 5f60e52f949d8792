"""``/api/models``: pull a model from the hub, list, read, delete (docs/api.md#models-pull-list-delete),
and a repository's files before a pull (``/api/models/files``).

A pull answers 202 with the record while its files download (progress as ``event: model`` on
``GET /api/events``), and 200 when everything is already here (nothing is downloaded)."""

from __future__ import annotations

from typing import Any

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from dgxmm.api.auth import require_admin, require_operator
from dgxmm.context import ctx_of
from dgxmm.context import Context
from dgxmm.modelstore.layout import REPO_PATTERN, REVISION_PATTERN
from dgxmm.modelstore.record import Status

router = APIRouter(prefix="/models", tags=["models"])


class ModelPull(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: str = Field(pattern=REPO_PATTERN, description="the repository, ORG/REPO")
    revision: str = Field("main", pattern=REVISION_PATTERN, description="a branch, tag or commit")
    include: list[str] = Field(
        default_factory=list, max_length=64, description="globs over the repository's paths (default: every file)"
    )


@router.post("", status_code=202)
async def pull_model(
    body: ModelPull, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> JSONResponse:
    record, began = await ctx.models.pull(body.repo, body.revision, body.include, user=user)
    already = record.status is Status.READY and not began
    return JSONResponse(ctx.models.view(record), status_code=200 if already else 202)


@router.get("")
async def list_models(ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)) -> list[dict[str, Any]]:
    return [ctx.models.view(record) for record in ctx.models.all()]


@router.get("/files")
async def repository_files(
    repo: Annotated[str, Query(pattern=REPO_PATTERN, description="the repository, ORG/REPO")],
    revision: Annotated[str, Query(pattern=REVISION_PATTERN, description="a branch, tag or commit")] = "main",
    include: Annotated[
        list[str], Query(max_length=64, description="globs over the paths, as a pull applies them")
    ] = [],  # noqa: B006 (FastAPI copies it)
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_operator),
) -> dict[str, Any]:
    """The repository's files with their sizes, as the hub lists them now, before a pull (the
    admin token only: a viewer's token is 403, as dgxmm would ask with the operator's hub token):
    the hub's refusal is its status (404, 401 naming ``hub_token_file``), a hub that sends
    nothing in time 504."""
    return await ctx.models.files(repo, revision, include)


@router.get("/{model_id}")
async def get_model(
    model_id: str, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> dict[str, Any]:
    return ctx.models.view(ctx.models.get(model_id))


@router.delete("/{model_id}")
async def delete_model(
    model_id: str, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> dict[str, Any]:
    """Cancels a download and removes the files no other snapshot shares; 409 ``model_in_use``
    while a deployment refers to the model."""
    await ctx.models.delete(model_id, user=user)
    return {"removed": model_id}
