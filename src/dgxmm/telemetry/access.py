"""Access lines: one per request, with the method, the path without its query string, the status
and the duration; for the gateway also the error code and the request's fields. No header and
no query string is ever written, so no key can end up in the log.

``finish`` ends a gateway request: its metrics, then its access line. A request that never
showed a valid key is counted and summarised instead (``telemetry.refusals``): refused traffic
costs its sender nothing and must not push served requests out of the records. ``AccessLog``
writes the lines of the admin API and the UI (Uvicorn's own access log is off: it writes query
strings).
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dgxmm.gateway.exchange import GONE, Exchange
from dgxmm.logs import access, fields, printable
from dgxmm.telemetry.activity import Activity, record_of
from dgxmm.telemetry.metrics import Metrics
from dgxmm.telemetry.refusals import Refusals


class Finisher:
    """The gateway's ``Finish``: ``finish`` with dgxmm's metrics and its activity log for a
    request that showed a valid key; metrics and the refusals' summary for one that did not."""

    def __init__(self, metrics: Metrics, activity: Activity | None = None, refusals: Refusals | None = None) -> None:
        self.metrics = metrics
        self.activity = activity
        self.refusals = refusals if refusals is not None else Refusals(sample=self.sample)

    def __call__(self, method: str, path: str, ex: Exchange) -> None:
        if ex.keyed:
            finish(self.metrics, method, path, ex, self.activity)
            return
        if not ex.status:
            ex.status = GONE
        self.metrics.exchange_done(ex, time.monotonic())
        self.refusals.add(method, path, ex)

    def sample(self, method: str, path: str, ex: Exchange) -> None:
        """A refused request written in full: its access line."""
        _access_line(method, path, ex, time.monotonic())


def finish(metrics: Metrics, method: str, path: str, ex: Exchange, activity: Activity | None = None) -> None:
    """A gateway request ended: record it (metrics, activity), then write its access line (at
    info level)."""
    now = time.monotonic()
    if not ex.status:
        ex.status = GONE
    metrics.exchange_done(ex, now)
    if activity is not None:
        activity.add(record_of(ex, now, time.time(), metrics.load_waited_for(ex)))
    _access_line(method, path, ex, now)


def _access_line(method: str, path: str, ex: Exchange, now: float) -> None:
    if access.isEnabledFor(logging.INFO):
        # A model the router found no deployment for is named (the record's ``model``).
        named = f" (model {ex.model!r})" if ex.model is not None and ex.served_name is None else ""
        # A request of another API (Ollama's) is named by the router's route it was served as.
        via = f" (via {ex.api})" if ex.api != "openai" else ""
        access.info(
            "%s %s %d%s%s%s %.3f s",
            method,
            printable(path),
            ex.status,
            f" {ex.code}" if ex.code else "",
            named,
            via,
            now - ex.arrival,
            extra=fields(ex.deployment_id, ex.served_name, ex.request_id, ex.peer),
        )


class AccessLog:
    """ASGI wrapper writing an access line when each HTTP request of ``app`` ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not access.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        began = time.monotonic()
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            client = scope.get("client")
            access.info(
                "%s %s %d %.3f s",
                scope["method"],
                printable(scope["path"]),
                status or GONE,
                time.monotonic() - began,
                extra=fields(peer=client[0] if client else None),
            )
