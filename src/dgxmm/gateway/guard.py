"""PeerGuard: the first check of every on-demand request, in front of the gateway's routing.

It reads the raw TCP peer (the front door hands it over as the socket gave it; uvicorn runs with
proxy-header rewriting off for the rest, so nothing rewrites it from headers) and refuses, as a
plain 404, peers the policy does not allow and any request that carries a forwarding header: a
request that came through a proxy is refused even when the proxy sits on an allowed network.
Header names are compared with ``_`` read as ``-`` (``X_Forwarded_For``, see heads.py). The
headers are read once, here (``Heads``), and the gateway gets them so.

The caller only ever sees the 404 (the spec's "as if the route did not exist"), so the operator
gets the reason in the log instead: the peer, why, and the policy in force, at most once a
minute per peer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from dgxmm.gateway.heads import Heads
from dgxmm.gateway.peers import PeerPolicy
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_error
from dgxmm.gateway.exchange import Exchange, Finish, request_id_of, unrecorded

log = logging.getLogger(__name__)


class RefusalLog:
    """Logs a refusal at most once per ``interval_s`` per peer: a refused client that retries in
    a loop must not flood the log. At most ``max_peers`` peers are remembered; when that many
    were refused within one interval, further new peers are not logged until entries age out."""

    def __init__(
        self, interval_s: float = 60.0, max_peers: int = 4096, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval_s
        self._max_peers = max_peers
        self._clock = clock
        self._logged_at: dict[str, float] = {}

    def refused(self, peer: str, why: str, policy: PeerPolicy) -> None:
        now = self._clock()
        last = self._logged_at.get(peer)
        if last is not None and now - last < self._interval:
            return
        if last is None and len(self._logged_at) >= self._max_peers:
            self._logged_at = {p: t for p, t in self._logged_at.items() if now - t < self._interval}
            if len(self._logged_at) >= self._max_peers:
                return
        self._logged_at[peer] = now
        log.warning("on-demand gateway refused %s with 404: %s (peer policy %s)", peer, why, policy.in_force)


class Guarded(Protocol):
    """What the guard fronts: the gateway, given the request's headers as read once here."""

    async def serve(self, req: GatewayRequest, heads: Heads) -> None: ...


class PeerGuard:
    def __init__(
        self, inner: Guarded, policy: PeerPolicy, refusals: RefusalLog | None = None, finish: Finish = unrecorded
    ) -> None:
        self.inner = inner
        self.policy = policy
        self.refusals = refusals or RefusalLog()
        self._finish = finish

    async def serve(self, req: GatewayRequest) -> None:
        heads = Heads(req.headers)
        why = self._refusal(req, heads)
        if why is None:
            await self.inner.serve(req, heads)
            return
        client = req.client
        peer = client[0] if client else ""
        self.refusals.refused(peer or "an unknown peer", why, self.policy)
        # 404 as for a route that does not exist: no x-request-id either (the access line and the
        # metrics count it, with reason ``guard``).
        ex = Exchange(time.monotonic(), request_id_of(heads.request_id()), peer)
        ex.status, ex.code = 404, "guard"
        try:
            await send_error(req, 404, "not_found", "Not Found")
        finally:
            self._finish(req.method, req.path, ex)

    def _refusal(self, req: GatewayRequest, heads: Heads) -> str | None:
        """Why the request is refused, or None when it passes."""
        client = req.client
        if not client:
            return "no TCP peer address"
        if not self.policy.allows(client[0]):
            return "the peer is not allowed"
        spelled = heads.forwarding_header()
        if spelled is not None:
            return f"the request carries {spelled} (requests through a proxy are refused)"
        return None
