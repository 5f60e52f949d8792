"""PeerGuard: ASGI middleware in front of the on-demand routes, before any routing.

It reads the raw TCP peer (Uvicorn runs with proxy-header rewriting off, so ``scope["client"]``
is the socket's peer) and refuses, as a plain 404, peers the policy does not allow and any
request that carries a forwarding header: a request that came through a proxy is refused even
when the proxy sits on an allowed network.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from dgxmm.ondemand.peers import PeerPolicy
from dgxmm.ondemand.responses import send_error

FORWARDING_HEADERS = frozenset({b"x-forwarded-for", b"forwarded", b"x-real-ip"})


class PeerGuard:
    def __init__(self, app: ASGIApp, prefix: str, policy: PeerPolicy) -> None:
        self.app = app
        self.prefix = prefix.rstrip("/")
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._guarded(scope) and not self._passes(scope):
            await send_error(send, 404, "not_found", "Not Found")
            return
        await self.app(scope, receive, send)

    def _guarded(self, scope: Scope) -> bool:
        path: str = scope["path"]
        return path == self.prefix or path.startswith(self.prefix + "/")

    def _passes(self, scope: Scope) -> bool:
        client = scope.get("client")
        if not client or not self.policy.allows(client[0]):
            return False
        return not any(name in FORWARDING_HEADERS for name, _ in scope["headers"])
