"""Puts the gateway in front of the admin app: requests under ``{base}/ondemand`` never reach
FastAPI's routing (so they are not in the OpenAPI schema and the peer guard runs first)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class OndemandMount:
    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path == self.prefix or path.startswith(self.prefix + "/"):
                await scope["app"].state.ctx.gateway(scope, receive, send)
                return
        await self.app(scope, receive, send)
