"""``GET {base}/metrics``: dgxmm's metrics in Prometheus' text format (version 0.0.4, which every
Prometheus reads).

Protected like the admin API: the admin token (or a viewer token) as a bearer token. With ``[metrics] public = true``
a scraper may also call without a token, but only from a raw TCP peer that ``[metrics]
allowed_cidrs`` allows (the gateway's peer policy rules: ``auto``, the same exclusions) and
without forwarding headers, so neither a proxy nor the host through a published port passes.
The metrics are collected in the event loop, which owns every number they read, so they are a
consistent picture; turning them into text (most of a scrape's CPU: some milliseconds for a few
thousand lines) runs in a worker thread, so the gateway's requests are not held up meanwhile.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable, Iterable

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from dgxmm.gateway.heads import Heads
from dgxmm.gateway.peers import PeerPolicy


class ScrapeAccess:
    """Who may read the metrics: the admin token, or (public) an allowed peer without proxy."""

    def __init__(self, token: str, public: PeerPolicy | None, viewer: Callable[[str], bool] | None = None) -> None:
        self._token = token.encode()
        self.public = public
        self.viewer = viewer  # whether a bearer token is a viewer's (api/tokens.py)

    def allows(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token):
            return True
        if scheme.lower() == "bearer" and self.viewer is not None and self.viewer(given.strip()):
            return True
        if self.public is None or request.client is None:
            return False
        if Heads(request.scope["headers"]).forwarded is not None:  # came through a proxy (as the gateway's guard)
            return False
        return self.public.allows(request.client.host)


class Collected:
    """Metric families already collected, as ``generate_latest`` wants a registry."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        return self._families


async def render(registry: CollectorRegistry, names: list[str] | None = None) -> bytes:
    """The text page: collected here, in the event loop; formatted in a worker thread. ``names``:
    only those series (the ``name[]`` parameters, as prometheus_client's own handler takes them),
    and only the collectors that make them are asked."""
    collected = Collected((registry.restricted_registry(names) if names else registry).collect())
    return await asyncio.to_thread(generate_latest, collected)


def install(app: FastAPI, base: str) -> None:
    @app.get(f"{base}/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        ctx = request.app.state.ctx
        if not ctx.scrape.allows(request):
            raise HTTPException(401, "a valid admin bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        names = request.query_params.getlist("name[]")
        return Response(await render(ctx.metrics.registry, names), media_type=CONTENT_TYPE_PLAIN_0_0_4)
