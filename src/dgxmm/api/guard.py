"""AdminGuard: the admin API's checks that must come before FastAPI reads a single body byte.

FastAPI resolves a route's body during dependency resolution, before ``require_admin`` runs: an
unauthenticated caller could make dgxmm parse (and hold) a body of any size, and got 422 instead
of 401 for a body that is not JSON. This ASGI layer in front of the admin app, for every path
under ``{base}/api`` except the OpenAPI schema and its docs page:

1. checks the bearer token from the headers alone (401, ``WWW-Authenticate: Bearer``): the
   admin token, or a viewer token (api/tokens.py), which may ``GET`` and ``HEAD`` only and is
   403 ``forbidden`` on every other method;
   a peer that sent ``failures.limit`` wrong tokens in a window gets 429 for its wrong ones
   until the window ends (a script with an old token is told to back off, and guessing shows in
   the log), while the right token, from that peer too, is still served: local users share
   127.0.0.1, and one of them must not lock the operator out. No token at all (no or an empty
   ``Authorization``) is a plain 401, never counted: it is no guess;
2. refuses a ``Content-Length`` above ``max_body_bytes`` with 413 without reading the body;
3. reads the body up to the limit (413 as soon as it passes it) and hands it to the app.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dgxmm.api.auth import UNAUTHORIZED, token_matches
from dgxmm.errors import error_body
from dgxmm.front.body import BodyTimeout, ClientGone, read_body
from dgxmm.gateway.ratelimit import FailureLimiter

log = logging.getLogger(__name__)


class AdminGuard:
    def __init__(
        self,
        app: ASGIApp,
        prefix: str,
        open_paths: frozenset[str],
        max_body_bytes: int,
        token: Callable[[], str],
        failures: FailureLimiter,
        body_timeout_s: float | None = None,
        viewer: Callable[[str], bool] | None = None,
    ) -> None:
        self.app = app
        self._viewer = viewer  # whether a bearer token is a viewer's (read-only)
        self.prefix = prefix.rstrip("/")
        self.open_paths = open_paths
        self.max_body_bytes = max_body_bytes
        self._token = token
        self._failures = failures
        self._body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guarded(scope):
            await self.app(scope, receive, send)
            return
        headers = {name: value for name, value in scope["headers"]}
        authorization = headers.get(b"authorization")
        if authorization is None or not token_matches(authorization.decode("latin-1"), self._token()):
            if authorization is not None and self._is_viewer(authorization.decode("latin-1")):
                if scope["method"] not in ("GET", "HEAD"):
                    answer = JSONResponse(error_body(403, "forbidden", "a viewer token may only read"), 403)
                    await answer(scope, receive, send)
                    return
            else:
                await self._refused(scope, receive, send, guess=bool(authorization and authorization.strip()))
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
            answer = JSONResponse(
                error_body(408, "request_timeout", f"the body made no progress for {self._body_timeout_s:g} s"),
                408,
                {"connection": "close"},
            )
            await answer(scope, receive, send)
            return
        if body is None:
            await self._too_large(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _is_viewer(self, authorization: str) -> bool:
        scheme, _, given = authorization.partition(" ")
        return self._viewer is not None and scheme.lower() == "bearer" and self._viewer(given.strip())

    def _guarded(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            return False
        return not (path in self.open_paths and scope["method"] in ("GET", "HEAD"))

    async def _refused(self, scope: Scope, receive: Receive, send: Send, guess: bool) -> None:
        """401 for a missing or wrong token, counted against the peer when it was a guess; 429
        with ``Retry-After`` for a wrong one once the peer has used up its window."""
        peer = scope["client"][0] if scope.get("client") else ""
        if guess and self._failures.exhausted(peer):
            retry = self._failures.retry_after(peer)
            answer = JSONResponse(
                error_body(429, "rate_limited", f"too many wrong admin tokens: retry in {retry} s"),
                429,
                {"retry-after": str(retry)},
            )
            await answer(scope, receive, send)
            return
        if guess:
            self._failures.failed(peer)
            if self._failures.exhausted(peer):
                log.warning(
                    "%s sent %d wrong admin tokens: its wrong ones get 429 for %d s",
                    peer or "a caller",
                    self._failures.limit,
                    self._failures.retry_after(peer),
                )
        await JSONResponse(error_body(401, "unauthorized", UNAUTHORIZED), 401, {"www-authenticate": "Bearer"})(
            scope, receive, send
        )

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The connection stays open: the rest of the body is read and dropped by the server, and
        # the client sees this answer rather than a reset in the middle of its upload.
        await JSONResponse(error_body(413, "request_too_large", f"the body exceeds {self.max_body_bytes} bytes"), 413)(
            scope, receive, send
        )


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
