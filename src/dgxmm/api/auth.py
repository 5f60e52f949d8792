"""Bearer-token check for the admin API (the token lives in ``admin_token_file``)."""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Protocol

from fastapi import HTTPException, Request

from dgxmm.datadir import make_private_dir, open_private
from dgxmm.errors import DgxmmError

log = logging.getLogger(__name__)

UNAUTHORIZED = "a valid admin bearer token is required"


def load_or_create_token(path: Path) -> str:
    """Read the admin token; on a first start create one (mode 0600) so `make run` just works."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token
    if not path.parent.exists():
        make_private_dir(path.parent)
    token = secrets.token_urlsafe(32)
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.warning("created an admin token in %s", path)
    return token


def token_matches(authorization: str, expected: str) -> bool:
    """Whether an ``Authorization`` header carries the bearer token ``expected`` (the scheme in
    any case, the comparison in constant time)."""
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


class Readers(Protocol):
    """The viewer tokens (api/tokens.py ``ViewerTokens``): the name of a given token's reader."""

    def check(self, given: str) -> Any: ...


async def require_admin(request: Request) -> str:
    """FastAPI dependency: the caller's bearer token must be the admin token, or for a read
    (``GET``, ``HEAD``) a viewer token. Returns the user name recorded in audit rows.
    (``AdminGuard`` has checked it already, before the body.)"""
    authorization = request.headers.get("authorization", "")
    if token_matches(authorization, request.app.state.ctx.admin_token):
        return "admin"
    readers: Readers | None = getattr(request.app.state, "viewers", None)
    scheme, _, given = authorization.partition(" ")
    if request.method in ("GET", "HEAD") and readers is not None and scheme.lower() == "bearer":
        reader = readers.check(given.strip())
        if reader is not None:
            return f"viewer {reader.name}"
    raise HTTPException(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})


class OperatorOnly(DgxmmError):
    status = 403
    code = "forbidden"


async def require_operator(request: Request) -> str:
    """FastAPI dependency of a read that makes dgxmm act with the operator's own credentials
    (``GET /api/models/files`` asks the hub with ``hub_token_file``'s token, which may list
    private or gated repositories): the admin token only; a viewer token is 403 ``forbidden``,
    before anything is asked. Viewers read what dgxmm holds, not what the operator may reach."""
    user = await require_admin(request)
    if user != "admin":
        raise OperatorOnly("a viewer token may not make dgxmm ask the hub: only the admin token may")
    return user
