"""The outermost app: requests under ``{base}/ondemand`` and the model router's path (``/v1``) go
to the gateway (peer guard first), Ollama's API (``/api``, ``ollama.api``) and llama.cpp's model
management (``/models``, ``llamacpp.api``, and llama-swap's unload under ``/api``, claimed before
Ollama's) to the gateway by way of their translations, everything else to the admin side
(``AdminGuard``, then FastAPI). The gateway thus never passes
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

Ollama's own listener (``[ollama] listen``) is a second socket of the same server: a request
whose connection came in on its port reaches Ollama's API and nothing else (every other path is
404 in Ollama's shape), so a port opened for Ollama's clients exposes neither the console, the
admin API nor ``/v1``.
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
from dgxmm.llamacpp.api import ModelsApi
from dgxmm.ollama.api import OllamaApi
from dgxmm.telemetry.access import AccessLog

HEALTH_PATH = "/health"  # on the listener's root, whatever the base path (settings keep it free)
_SERVING = orjson.dumps({"status": "ok"})
# 503 in dgxmm's error envelope, with the same "status" field as the 200 for checks that read it.
_STOPPING = orjson.dumps({"status": "shutting_down", **error_body(503, "shutting_down", "dgxmm is shutting down")})
_OLLAMA_ONLY = orjson.dumps({"error": "not found: this port serves Ollama's API (/api/...) only"})
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
        ollama: OllamaApi | None = None,
        models: ModelsApi | None = None,
        ollama_port: int | None = None,
    ) -> None:
        self.api = api
        self.prefix = prefix.rstrip("/")
        self.router = router  # the model router's path (``[router] path``), when it is enabled
        self.ollama = ollama  # Ollama's API at ``/api`` (``[ollama] enabled``, through the router)
        self.models = models  # llama.cpp's model management at the root (``[router] models_api``)
        self.ollama_port = ollama_port  # Ollama's own listener's port (``[ollama] listen``)
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
        if self.ollama_port is not None and scope["type"] == "http" and _port(scope) == self.ollama_port:
            await self.ollama_only(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == HEALTH_PATH:
            await self.health(scope["method"], send)
            return
        if scope["type"] == "http" and self.models is not None and self.models.claims(scope["path"]):
            req = AsgiRequest(scope, receive, send)
            ctx = self.api.state.ctx
            try:
                await self.models.serve(req, self.gateway or ctx.entrance, ctx.bus, ctx.stopping)
            finally:
                req.close()
            return
        if scope["type"] == "http" and self.ollama is not None and self.ollama.claims(scope["path"]):
            await self.serve_ollama(scope, receive, send)
            return
        if scope["type"] == "http" and self.routes_to_gateway(scope["path"]):
            req = AsgiRequest(scope, receive, send)
            try:
                await (self.gateway or self.api.state.ctx.entrance).serve(req)
            finally:
                req.close()
            return
        await self.admin(scope, receive, send)

    async def serve_ollama(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.ollama is not None
        req = AsgiRequest(scope, receive, send)
        ctx = self.api.state.ctx
        try:
            store = (ctx.models, ctx.admin_token)
            await self.ollama.serve(req, self.gateway or ctx.entrance, ctx.deployer, ctx.ondemand, store)
        finally:
            req.close()

    async def ollama_only(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request on Ollama's own listener: Ollama's API, else 404 in its shape."""
        if self.ollama is not None and self.ollama.claims(scope["path"]):
            await self.serve_ollama(scope, receive, send)
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_OLLAMA_ONLY)).encode())]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else _OLLAMA_ONLY})

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


def _port(scope: Scope) -> int | None:
    """The local port the request's connection came in on (None where the server gives none)."""
    server = scope.get("server")
    return None if server is None else server[1]
