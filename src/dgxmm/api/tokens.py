"""Read-only admin tokens (``role: viewer``): for dashboards and teammates who watch.

A viewer token reads every ``GET`` of the admin API, the event streams and the metrics, and is
403 ``forbidden`` on everything that changes state (``AdminGuard`` decides, from the method,
before any body is read) and on a read that would make dgxmm ask the hub with the operator's
token (``require_operator``). The admin token file stays the admin; only it makes or revokes viewer
tokens. As for caller keys, the store keeps a SHA-256 digest of each token, never the token, and
a given token is looked up by its digest (``ViewerTokens.check``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dgxmm.api.auth import require_admin
from dgxmm.context import Context, ctx_of
from dgxmm.errors import InvalidInput, NotFound

router = APIRouter(prefix="/tokens", tags=["tokens"])

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
TOKEN_PREFIX = "dgxmm-view-"
READS = frozenset({"GET", "HEAD"})


class TokenRecords(Protocol):
    def load_admin_tokens(self) -> list[dict[str, Any]]: ...

    def put_admin_token(self, row: dict[str, Any]) -> None: ...

    def delete_admin_token(self, token_id: str) -> None: ...


@dataclass(frozen=True)
class Viewer:
    id: str
    name: str
    prefix: str
    digest: bytes
    created_at: float

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "role": "viewer",
            "prefix": self.prefix,
            "created_at": self.created_at,
        }


_NOBODY = Viewer("", "", "", b"", 0.0)


class ViewerTokens:
    """The viewer tokens' one owner: in memory, by digest, and in the store."""

    def __init__(self, records: TokenRecords) -> None:
        self._records = records
        self._by_digest: dict[bytes, Viewer] = {}
        for row in records.load_admin_tokens():
            viewer = Viewer(row["id"], row["name"], row["prefix"], bytes.fromhex(row["digest"]), row["created_at"])
            self._by_digest[viewer.digest] = viewer

    def check(self, given: str) -> Viewer | None:
        digest = hashlib.sha256(given.encode()).digest()
        viewer = self._by_digest.get(digest, _NOBODY)
        return viewer if hmac.compare_digest(viewer.digest, digest) else None

    def all(self) -> list[Viewer]:
        return sorted(self._by_digest.values(), key=lambda v: (v.created_at, v.id))

    def create(self, name: str) -> tuple[Viewer, str]:
        if any(v.name == name for v in self._by_digest.values()):
            raise InvalidInput(f"name: a token called {name} exists", field="name")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        viewer = Viewer(
            "tok-" + secrets.token_hex(6),
            name,
            secret[: len(TOKEN_PREFIX) + 6],
            hashlib.sha256(secret.encode()).digest(),
            time.time(),
        )
        self._records.put_admin_token(
            {**viewer.view(), "digest": viewer.digest.hex()} | {"created_at": viewer.created_at}
        )
        self._by_digest[viewer.digest] = viewer
        return viewer, secret

    def revoke(self, token_id: str) -> Viewer:
        viewer = next((v for v in self._by_digest.values() if v.id == token_id), None)
        if viewer is None:
            raise NotFound(f"no token {token_id}")
        self._records.delete_admin_token(token_id)
        del self._by_digest[viewer.digest]
        return viewer


def bearer(authorization: str) -> str | None:
    scheme, _, given = authorization.partition(" ")
    return given.strip() if scheme.lower() == "bearer" else None


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="letters, digits and ._@- (up to 64): how audit rows name its reader")
    role: Literal["viewer"] = Field(
        description="viewer: every GET but those that ask the hub, the event streams and the metrics; nothing else"
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError("must be 1 to 64 letters, digits or ._@- (starting with a letter or digit)")
        return value


async def viewers_of(request: Request) -> ViewerTokens:
    viewers: ViewerTokens = request.app.state.viewers
    return viewers


@router.get("")
async def list_tokens(
    viewers: ViewerTokens = Depends(viewers_of), user: str = Depends(require_admin)
) -> list[dict[str, Any]]:
    return [viewer.view() for viewer in viewers.all()]


@router.post("", status_code=201)
async def create_token(
    body: TokenCreate,
    viewers: ViewerTokens = Depends(viewers_of),
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> JSONResponse:
    """The new token's record and the token itself, shown this once."""
    viewer, secret = viewers.create(body.name)
    ctx.bus.audit("token_created", actor="api", user=user, deployment_id=None, new=viewer.view())
    return JSONResponse({**viewer.view(), "token": secret}, status_code=201)


@router.delete("/{token_id}", status_code=204)
async def revoke_token(
    token_id: str,
    viewers: ViewerTokens = Depends(viewers_of),
    ctx: Context = Depends(ctx_of),
    user: str = Depends(require_admin),
) -> Response:
    viewer = viewers.revoke(token_id)
    ctx.bus.audit("token_revoked", actor="api", user=user, deployment_id=None, old=viewer.view())
    return Response(status_code=204)
