"""PeerGuard: ASGI middleware in front of the on-demand routes, before any routing.

It reads the raw TCP peer (Uvicorn runs with proxy-header rewriting off, so ``scope["client"]``
is the socket's peer) and refuses, as a plain 404, peers the policy does not allow and any
request that carries a forwarding header: a request that came through a proxy is refused even
when the proxy sits on an allowed network. Header names are compared with ``_`` read as ``-``
(``X_Forwarded_For``), because servers that map headers to CGI-style variables (WSGI,
``HTTP_X_FORWARDED_FOR``) cannot tell the two apart.

The caller only ever sees the 404 (the spec's "as if the route did not exist"), so the operator
gets the reason in the log instead: the peer, why, and the policy in force, at most once a
minute per peer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from dgxmm.ondemand.peers import PeerPolicy
from dgxmm.ondemand.responses import send_error
from dgxmm.telemetry.access import finish
from dgxmm.telemetry.exchange import Exchange, request_id
from dgxmm.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

UNDERSCORE = ord("_")  # an int: CPython 3.11 tests bytes-in-bytes by raising and clearing a TypeError first (10x slower)
FORWARDING_HEADERS = {b"x-forwarded-for": "X-Forwarded-For", b"forwarded": "Forwarded",
                      b"x-real-ip": "X-Real-IP"}  # fmt: skip


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


class PeerGuard:
    def __init__(
        self, app: ASGIApp, prefix: str, policy: PeerPolicy, refusals: RefusalLog | None = None,
        metrics: Metrics | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.prefix = prefix.rstrip("/")
        self.policy = policy
        self.refusals = refusals or RefusalLog()
        self._metrics = metrics if metrics is not None else Metrics()

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The inner app's own coroutine when the request passes (no frame of this guard's on
        every resumption of the request), else the refusal."""
        if scope["type"] == "http" and self._guarded(scope):
            why = self._refusal(scope)
            if why is not None:
                client = scope.get("client")
                self.refusals.refused(client[0] if client else "an unknown peer", why, self.policy)
                return self._refuse(scope, send)
        return self.app(scope, receive, send)  # type: ignore[return-value]

    async def _refuse(self, scope: Scope, send: Send) -> None:
        """404 as for a route that does not exist: no x-request-id either (the access line and the
        metrics count it, with reason ``guard``)."""
        client = scope.get("client")
        ex = Exchange(time.monotonic(), request_id(scope), client[0] if client else "")
        ex.status, ex.code = 404, "guard"
        try:
            await send_error(send, 404, "not_found", "Not Found")
        finally:
            finish(self._metrics, scope, ex)

    def _guarded(self, scope: Scope) -> bool:
        path: str = scope["path"]
        return path == self.prefix or path.startswith(self.prefix + "/")

    def _refusal(self, scope: Scope) -> str | None:
        """Why the request is refused, or None when it passes."""
        client = scope.get("client")
        if not client:
            return "no TCP peer address"
        if not self.policy.allows(client[0]):
            return "the peer is not allowed"
        for name, _ in scope["headers"]:  # ASGI header names are lowercase
            spelled = FORWARDING_HEADERS.get(name.replace(b"_", b"-") if UNDERSCORE in name else name)
            if spelled is not None:
                return f"the request carries {spelled} (requests through a proxy are refused)"
        return None
