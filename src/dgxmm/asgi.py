"""The outermost app: requests under ``{base}/ondemand`` and the model router's path (``/v1``) go
to the gateway (peer guard first), everything else to the admin side (``AdminGuard``, then FastAPI). The gateway thus never passes
FastAPI's routing or middleware (it is not in the OpenAPI schema).

Every request comes through ASGI; a gateway request is read and answered through
``AsgiRequest``, the shape the gateway reads (``request.py``), whatever server serves dgxmm. The
gateway writes its own access lines; the admin side's are written by ``AccessLog``.

It also keeps the gateway to its share of the server's connections: at most
``limits.gateway_share`` gateway requests run at once, and one more gets 503 ``server_busy`` and
its connection closed, so the admin API and UI always have ``limits.admin_reserve`` places.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from dgxmm.errors import error_body
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits
from dgxmm.gateway.asgirequest import AsgiRequest
from dgxmm.gateway.guard import PeerGuard
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_json
from dgxmm.telemetry.access import AccessLog
from dgxmm.gateway.exchange import Exchange, Finish, request_id


class OndemandFront:
    def __init__(
        self, api: FastAPI, prefix: str, admin: ASGIApp, limits: FrontLimits, budget: ConnectionBudget,
        router: str | None = None,
    ) -> None:
        self.api = api
        self.prefix = prefix.rstrip("/")
        self.router = router  # the model router's path (``[router] path``), when it is enabled
        self.admin = AccessLog(admin)
        self.limits = limits
        self.budget = budget  # the server's connections (the server is built around this app)
        # The running service's gateway and how its requests end, set by the lifespan
        # (``serving``): read per request from here, not through ``state.ctx`` (Starlette's State
        # finds it by way of a caught AttributeError).
        self.gateway: PeerGuard | None = None
        self.finish: Finish | None = None

    def serving(self, gateway: PeerGuard | None, finish: Finish | None) -> None:
        self.gateway, self.finish = gateway, finish

    @property
    def state(self) -> Any:
        """The admin app's state (``state.ctx`` is the running service's context)."""
        return self.api.state

    def begin_shutdown(self) -> None:
        """The server stops accepting (SIGTERM): tell the running service, if it started."""
        ctx = getattr(self.api.state, "ctx", None)
        if ctx is not None:
            ctx.begin_shutdown()

    def routes_to_gateway(self, path: str) -> bool:
        """Whether a request for ``path`` (percent-decoded) is the gateway's or the router's."""
        return _under(path, self.prefix) or (self.router is not None and _under(path, self.router))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.routes_to_gateway(scope["path"]):
            req = AsgiRequest(scope, receive, send)
            try:
                await self.serve(req)
            finally:
                req.close()
            return
        await self.admin(scope, receive, send)

    async def serve(self, req: GatewayRequest) -> None:
        """One gateway request, within the gateway's share of the connections."""
        budget = self.budget
        if budget.gateway_requests >= self.limits.gateway_share:
            client = req.client
            ex = Exchange(time.monotonic(), request_id(req.headers), client[0] if client else "")
            ex.status, ex.code = 503, "server_busy"
            try:
                await send_json(req, 503, error_body(503, "server_busy",
                                f"the gateway is serving {budget.gateway_requests} requests, its most"),
                                [(b"retry-after", b"1"), (b"connection", b"close"), ex.header])  # fmt: skip
            finally:
                (self.finish or self.api.state.ctx.finish)(req.method, req.path, ex)
            return
        budget.gateway_requests += 1
        try:
            await (self.gateway or self.api.state.ctx.gateway).serve(req)
        finally:
            budget.gateway_requests -= 1


def _under(path: str, prefix: str) -> bool:
    return path.startswith(prefix) and (len(path) == len(prefix) or path[len(prefix)] == "/")
