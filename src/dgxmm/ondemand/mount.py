"""The outermost ASGI app: requests under ``{base}/ondemand`` go straight to the gateway (peer
guard first), everything else to the admin app. The gateway thus never passes FastAPI's routing
or middleware (it is not in the OpenAPI schema, and its chunks are not wrapped per send)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send


class OndemandFront:
    def __init__(self, api: FastAPI, prefix: str) -> None:
        self.api = api
        self.prefix = prefix.rstrip("/")

    @property
    def state(self) -> Any:
        """The admin app's state (``state.ctx`` is the running service's context)."""
        return self.api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path == self.prefix or path.startswith(self.prefix + "/"):
                await self.api.state.ctx.gateway(scope, receive, send)
                return
        await self.api(scope, receive, send)
