"""Bearer-token check for the admin API (the token lives in ``admin_token_file``)."""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

from fastapi import HTTPException, Request

log = logging.getLogger(__name__)


def load_or_create_token(path: Path) -> str:
    """Read the admin token; on a first start create one (mode 0600) so `make run` just works."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.warning("created an admin token in %s", path)
    return token


def require_admin(request: Request) -> str:
    """FastAPI dependency: the caller's bearer token must be the admin token. Returns the user
    name recorded in audit rows."""
    expected: str = request.app.state.ctx.admin_token
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise HTTPException(401, "a valid admin bearer token is required",
                            headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    return "admin"
