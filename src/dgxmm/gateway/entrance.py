"""The gateway's one entrance: every request for the on-demand gateway or the model router comes
in through ``Entrance.serve``, whoever sends it, a network caller (``asgi.OndemandFront``) or the
console's playground (api/playground.py).

It keeps the gateway to its share of the server's connections: at most ``limits.gateway_share``
gateway requests run at once, and one more gets 503 ``server_busy`` and its connection closed, so
the admin API and UI always keep ``limits.admin_reserve`` places (docs/server.md). Then the peer
guard (guard.py) reads the request's headers once and hands it to the gateway.

What a kind of caller is exempt from is its ``Caller``, one line each, so that no caller takes
another way in without saying so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dgxmm.errors import error_body
from dgxmm.front.connections import ConnectionBudget
from dgxmm.gateway.exchange import Exchange, Finish, request_id, unrecorded
from dgxmm.gateway.guard import PeerGuard
from dgxmm.gateway.heads import Heads
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_json


@dataclass(frozen=True)
class Caller:
    """A kind of caller, and what of the entrance it passes through: the share always."""

    name: str
    peer_guard: bool = True


NETWORK = Caller("network")  # a request on the gateway's or the router's path
CONSOLE = Caller("console", peer_guard=False)  # the playground: the admin token stands in for the peer guard


class Entrance:
    def __init__(
        self, prefix: str, guard: PeerGuard, budget: ConnectionBudget, share: int, finish: Finish = unrecorded
    ) -> None:
        self.prefix = prefix.rstrip("/")  # the gateway's path, ``{base}/ondemand``
        self.guard = guard  # in front of the gateway (``guard.inner``)
        self.budget = budget  # the server's connections; ``gateway_requests`` is counted here
        self.share = share  # ``limits.gateway_share``
        self._finish = finish

    async def serve(self, req: GatewayRequest, caller: Caller = NETWORK) -> None:
        """One gateway request, within the gateway's share of the connections."""
        budget = self.budget
        if budget.gateway_requests >= self.share:
            await self._busy(req)
            return
        budget.gateway_requests += 1
        try:
            if caller.peer_guard:
                await self.guard.serve(req)
            else:
                await self.guard.inner.serve(req, Heads(req.headers))
        finally:
            budget.gateway_requests -= 1

    async def _busy(self, req: GatewayRequest) -> None:
        client = req.client
        ex = Exchange(time.monotonic(), request_id(req.headers), client[0] if client else "")
        ex.status, ex.code = 503, "server_busy"
        try:
            await send_json(
                req,
                503,
                error_body(
                    503, "server_busy", f"the gateway is serving {self.budget.gateway_requests} requests, its most"
                ),
                [(b"retry-after", b"1"), (b"connection", b"close"), ex.header],
            )
        finally:
            self._finish(req.method, req.path, ex)
