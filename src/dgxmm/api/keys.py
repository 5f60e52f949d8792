"""``/api/keys``: caller keys for the gateway (``gateway.callerkeys`` owns them). A new key's
secret is in the answer to its ``POST`` and nowhere else, ever: records show its first characters
(``prefix``). Every change is audited, with the record and never the secret."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from dgxmm.api.auth import require_admin
from dgxmm.context import Context, ctx_of
from dgxmm.errors import InvalidInput, NotFound
from dgxmm.gateway.callerkeys import glob_problem
from dgxmm.gateway.keyrecord import KEY_FILE_NAME, PRIORITY_MAX, PRIORITY_MIN, CallerKey
from dgxmm.settings import Progress

router = APIRouter(prefix="/keys", tags=["keys"])

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
MAX_MODELS = 100


def _models(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    if len(value) > MAX_MODELS:
        raise ValueError(f"at most {MAX_MODELS} globs")
    for glob in value:
        problem = glob_problem(glob)
        if problem is not None:
            raise ValueError(problem)
    return value


def _expires(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value[:40]!r} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)  # a time without its zone is UTC
    if when.timestamp() <= time.time():
        raise ValueError("is in the past")
    return value


def expires_at_of(value: str | None) -> float | None:
    if value is None:
        return None
    when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return (when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)).timestamp()


class KeyLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[str] | None = Field(
        None, description="names or globs over served names and aliases; null: every model"
    )
    expires_at: str | None = Field(None, description="ISO 8601 (UTC when no zone is given), or null: never")
    max_concurrent: int | None = Field(None, ge=1, description="requests in flight at once with this key")
    tokens_per_day: int | None = Field(None, ge=1, description="prompt + completion tokens per UTC day")
    keep_alive: StrictBool = Field(
        True, description="whether its requests may set the model's idle timer (keep_alive, ttl)"
    )
    progress: Progress = Field(
        "off",
        description="reasoning: a streamed chat that waits for a start or memory gets dgxmm's lines as "
        "reasoning_content before the answer (chat UIs show them folded as thinking)",
    )
    priority: int = Field(
        0,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="its requests go before those of lower priority (a request may ask for less, never more)",
    )

    @field_validator("models")
    @classmethod
    def _check_models(cls, value: list[str] | None) -> list[str] | None:
        return _models(value)

    @field_validator("expires_at")
    @classmethod
    def _check_expires(cls, value: str | None) -> str | None:
        return _expires(value)


class KeyCreate(KeyLimits):
    name: str = Field(description="letters, digits and ._@- (up to 64): how activity rows and metrics name it")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError("must be 1 to 64 letters, digits or ._@- (starting with a letter or digit)")
        if value == KEY_FILE_NAME:
            raise ValueError(f"{KEY_FILE_NAME!r} names the on-demand key file")
        return value


class KeyPatch(KeyLimits):
    pass


def _get(ctx: Context, key_id: str) -> CallerKey:
    key = ctx.callers.get(key_id)
    if key is None:
        raise NotFound(f"no key {key_id}")
    return key


@router.get("")
async def list_keys(ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)) -> list[dict[str, Any]]:
    now = time.time()
    return [key.view(now) for key in ctx.callers.all()]


@router.post("", status_code=201)
async def create_key(
    body: KeyCreate, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> JSONResponse:
    """The new key's record and its secret ``key``: shown this once (only a digest is kept)."""
    if ctx.callers.by_name(body.name) is not None:
        raise InvalidInput(f"name: a key called {body.name} exists", field="name")
    key, secret = ctx.callers.create(
        body.name,
        body.models,
        expires_at_of(body.expires_at),
        body.max_concurrent,
        body.tokens_per_day,
        keep_alive=body.keep_alive,
        progress=body.progress,
        priority=body.priority,
    )
    view = key.view(time.time())
    ctx.bus.audit("key_created", actor="api", user=user, deployment_id=None, new=_audited(view), text=_text(key))
    return JSONResponse({**view, "key": secret}, status_code=201)


@router.get("/{key_id}")
async def get_key(key_id: str, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)) -> dict[str, Any]:
    return _get(ctx, key_id).view(time.time())


@router.patch("/{key_id}")
async def change_key(
    key_id: str, body: KeyPatch, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> dict[str, Any]:
    """New limits or models; the fields not given stay as they are. In force at once, even when
    the database cannot be written (``persisted`` false: it is written once it can); requests
    in flight with a model the key no longer allows are ended."""
    key = _get(ctx, key_id)
    old = _audited(key.view(time.time()))
    changes = body.model_dump(include=body.model_fields_set)
    if "expires_at" in changes:
        changes["expires_at"] = expires_at_of(changes["expires_at"])
    key, persisted = ctx.callers.change(key, changes)
    view = key.view(time.time())
    ctx.bus.audit(
        "key_changed", actor="api", user=user, deployment_id=None, old=old, new=_audited(view), text=_text(key)
    )
    return {**view, **_persisted(persisted, "the change")}


@router.delete("/{key_id}", status_code=204)
async def revoke_key(key_id: str, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)) -> Response:
    """The next request with the key is 401, and its requests in flight end: at once, even when
    the database cannot be written (then 202 with ``persisted`` false: it is written once it can)."""
    key = _get(ctx, key_id)
    old = _audited(key.view(time.time()))
    persisted = ctx.callers.revoke(key)
    ctx.bus.audit("key_revoked", actor="api", user=user, deployment_id=None, old=old, text=_text(key))
    if persisted:
        return Response(status_code=204)
    return JSONResponse({"id": key.id, "revoked": True, **_persisted(False, "the revocation")}, status_code=202)


@router.post("/{key_id}/end-requests")
async def end_requests(
    key_id: str, ctx: Context = Depends(ctx_of), user: str = Depends(require_admin)
) -> dict[str, Any]:
    """End the key's requests in flight now (their callers get 503 ``request_ended``, in the
    stream when one began); ``ended``: how many. The key itself stays as it is."""
    key = _get(ctx, key_id)
    count = ctx.callers.end_requests(key)
    text = f"Ended {count} requests in flight of {_text(key)}"
    ctx.bus.audit(
        "key_requests_ended", actor="api", user=user, deployment_id=None, old=_audited(key.view(time.time())), text=text
    )
    return {"id": key.id, "ended": count}


def _persisted(persisted: bool, what: str) -> dict[str, Any]:
    """What an answer says of the store: ``persisted``, and when false why it still holds."""
    if persisted:
        return {"persisted": True}
    return {
        "persisted": False,
        "message": f"{what} is in force now but the database cannot be written: dgxmm writes it "
        "as soon as it can (a restart before then would undo it)",
    }


def _audited(view: dict[str, Any]) -> dict[str, Any]:
    """What an audit row keeps of a key: its settings, not its counters."""
    return {
        name: view[name]
        for name in (
            "id",
            "name",
            "prefix",
            "models",
            "expires_at",
            "max_concurrent",
            "tokens_per_day",
            "keep_alive",
            "progress",
            "priority",
        )
    }


def _text(key: CallerKey) -> str:
    return f"key {key.name} ({key.prefix}...)"
