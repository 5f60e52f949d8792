"""The outermost app: requests under ``{base}/ondemand`` and the model router's path (``/v1``) go
to the gateway (peer guard first), everything else to the admin side (``AdminGuard``, then FastAPI). The gateway thus never passes
FastAPI's routing or middleware (it is not in the OpenAPI schema).

Every request comes through ASGI; a gateway request is read and answered through
``AsgiRequest``, the shape the gateway reads (``gateway/request.py``), whatever server serves dgxmm. The
gateway writes its own access lines; the admin side's are written by ``AccessLog``.

A gateway request goes in through the gateway's one entrance (``gateway.entrance.Entrance``: the
gateway's share of the server's connections, then the peer guard), as the console's playground's
requests do.

``GET`` and ``HEAD /health`` are answered here, before anything else: load balancers, uptime
checks and benchmark tools (guidellm) ask the listener's root whether it serves, without a key
and from wherever they run. The answer says only that dgxmm serves (200) or is shutting down
(503), nothing of its models or its host, so it needs no credentials (docs/server.md).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from dgxmm.errors import error_body
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits
from dgxmm.gateway.asgirequest import AsgiRequest
from dgxmm.gateway.entrance import Entrance
from dgxmm.gateway.paths import under
from dgxmm.telemetry.access import AccessLog

HEALTH_PATH = "/health"  # on the listener's root, whatever the base path (settings keep it free)
_SERVING = orjson.dumps({"status": "ok"})
# 503 in dgxmm's error envelope, with the same "status" field as the 200 for checks that read it.
_STOPPING = orjson.dumps({"status": "shutting_down", **error_body(503, "shutting_down", "dgxmm is shutting down")})
_NOT_ALLOWED = orjson.dumps(error_body(405, "method_not_allowed", "/health answers GET and HEAD"))


class OndemandFront:
    def __init__(
        self,
        api: FastAPI,
        prefix: str,
        admin: ASGIApp,
        limits: FrontLimits,
        budget: ConnectionBudget,
        router: str | None = None,
    ) -> None:
        self.api = api
        self.prefix = prefix.rstrip("/")
        self.router = router  # the model router's path (``[router] path``), when it is enabled
        self.admin = AccessLog(admin)
        self.limits = limits
        self.budget = budget  # the server's connections (the server is built around this app)
        # The running service's entrance to the gateway, set by the lifespan (``serving``): read
        # per request from here, not through ``state.ctx`` (Starlette's State finds it by way of
        # a caught AttributeError).
        self.gateway: Entrance | None = None
        self.stopping = False  # a shutdown began: /health answers 503 from then on

    def serving(self, gateway: Entrance | None) -> None:
        self.gateway = gateway

    @property
    def state(self) -> Any:
        """The admin app's state (``state.ctx`` is the running service's context)."""
        return self.api.state

    def begin_shutdown(self) -> None:
        """The server stops accepting (SIGTERM): tell the running service, if it started."""
        self.stopping = True
        ctx = getattr(self.api.state, "ctx", None)
        if ctx is not None:
            ctx.begin_shutdown()

    def routes_to_gateway(self, path: str) -> bool:
        """Whether a request for ``path`` (percent-decoded) is the gateway's or the router's."""
        return under(path, self.prefix) or (self.router is not None and under(path, self.router))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == HEALTH_PATH:
            await self.health(scope["method"], send)
            return
        if scope["type"] == "http" and self.routes_to_gateway(scope["path"]):
            req = AsgiRequest(scope, receive, send)
            try:
                await (self.gateway or self.api.state.ctx.entrance).serve(req)
            finally:
                req.close()
            return
        await self.admin(scope, receive, send)

    async def health(self, method: str, send: Send) -> None:
        """``/health``: 200 while the service serves (its lifespan started it and no shutdown
        began), else 503. No access line: an uptime check every few seconds would fill the log."""
        headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
        if method not in ("GET", "HEAD"):
            status, body = 405, _NOT_ALLOWED
            headers.append((b"allow", b"GET, HEAD"))
        elif self.gateway is not None and not self.stopping:
            status, body = 200, _SERVING
        else:
            status, body = 503, _STOPPING
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
