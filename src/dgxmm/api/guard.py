"""AdminGuard: the admin API's checks that must come before FastAPI reads a single body byte.

FastAPI resolves a route's body during dependency resolution, before ``require_admin`` runs: an
unauthenticated caller could make dgxmm parse (and hold) a body of any size, and got 422 instead
of 401 for a body that is not JSON. This ASGI layer in front of the admin app, for every path
under ``{base}/api`` except the OpenAPI schema and its docs page:

1. checks the bearer token from the headers alone (401, ``WWW-Authenticate: Bearer``);
2. refuses a ``Content-Length`` above ``max_body_bytes`` with 413 without reading the body;
3. reads the body up to the limit (413 as soon as it passes it) and hands it to the app.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dgxmm.api.auth import UNAUTHORIZED, token_matches
from dgxmm.errors import error_body
from dgxmm.front.body import BodyTimeout, ClientGone, read_body


class AdminGuard:
    def __init__(
        self, app: ASGIApp, prefix: str, open_paths: frozenset[str], max_body_bytes: int,
        token: Callable[[], str], body_timeout_s: float | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.prefix = prefix.rstrip("/")
        self.open_paths = open_paths
        self.max_body_bytes = max_body_bytes
        self._token = token
        self._body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guarded(scope):
            await self.app(scope, receive, send)
            return
        headers = {name: value for name, value in scope["headers"]}
        if not token_matches(headers.get(b"authorization", b"").decode("latin-1"), self._token()):
            answer = JSONResponse(error_body(401, "unauthorized", UNAUTHORIZED), 401, {"www-authenticate": "Bearer"})
            await answer(scope, receive, send)
            return
        if b"content-length" not in headers and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body
            return
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await self._too_large(scope, receive, send)
            return
        try:
            body = await read_body(receive, self.max_body_bytes, timeout_s=self._body_timeout_s)
        except ClientGone:
            return
        except BodyTimeout:
            answer = JSONResponse(error_body(408, "request_timeout", f"the body made no progress for "
                                                 f"{self._body_timeout_s:g} s"), 408, {"connection": "close"})
            await answer(scope, receive, send)
            return
        if body is None:
            await self._too_large(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _guarded(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            return False
        return not (path in self.open_paths and scope["method"] in ("GET", "HEAD"))

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The connection stays open: the rest of the body is read and dropped by the server, and
        # the client sees this answer rather than a reset in the middle of its upload.
        await JSONResponse(error_body(413, "request_too_large", f"the body exceeds {self.max_body_bytes} bytes"),
                           413)(scope, receive, send)  # fmt: skip


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body read already, then the real stream (for the
    disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
