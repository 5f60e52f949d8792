"""The one HTTP server of dgxmm, as ``dgxmm serve`` runs it and as the tests run it in-process.

``build_server`` makes the uvicorn server with dgxmm's protocol (``protocol``), its limits, and
the settings no one may change: proxy-header rewriting off (the gateway's peer guard must see
the raw TCP peer), no ``Server`` header, no WebSocket. ``listen`` binds the port before the
application starts, so a port in use stops start-up before any engine is touched.

``DgxmmServer`` shuts down in dgxmm's order on SIGTERM or SIGINT: stop accepting, tell the
application (every waiting request gets 503 now, nothing starts any more), close idle
connections, let requests in flight finish for up to ``[server] shutdown_grace_s``, cancel what
is left, then run the application's shutdown (engines stopped and recorded). A second SIGTERM
or SIGINT ends the grace at once; the application's shutdown still runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

from dgxmm.front.protocol import FrontConfig
from dgxmm.ondemand.mount import OndemandFront
from dgxmm.settings import ServerSettings, Settings

log = logging.getLogger(__name__)

BACKLOG = 2048
CANCEL_WAIT_S = 5.0  # how long cancelled requests may take to unwind after the grace


def listen(server: ServerSettings) -> socket.socket:
    """The listening socket (not inherited by engines); raises OSError if the port is taken."""
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    return socket.create_server((server.host, server.port), family=family, backlog=BACKLOG)


def build_server(settings: Settings, app: OndemandFront) -> DgxmmServer:
    server = settings.server
    config = FrontConfig(
        app,
        limits=app.limits,
        budget=app.budget,
        door=app,  # the gateway's requests skip ASGI (front/request.py)
        host=server.host,
        port=server.port,
        ws="none",
        lifespan="on",
        # The gateway's peer guard must see the raw TCP peer: never rewrite it from headers.
        proxy_headers=False,
        forwarded_allow_ips="",
        server_header=False,
        log_level=server.log_level,
        # Uvicorn's lines go through dgxmm's handler (text or JSON, telemetry/logs.py); its access
        # log is replaced by dgxmm's, which never writes the query string.
        log_config=None,
        access_log=False,
        backlog=BACKLOG,
        timeout_keep_alive=app.limits.keep_alive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=server.shutdown_grace_s,  # type: ignore[arg-type]
    )
    return DgxmmServer(config, app.begin_shutdown)


class DgxmmServer(uvicorn.Server):
    def __init__(self, config: FrontConfig, begin_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self.front = config
        self._begin_shutdown = begin_shutdown
        self.skip_grace = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.skip_grace = True
            log.warning("second %s: not waiting for requests in flight", signal.Signals(sig).name)
        self._captured_signals.append(sig)
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        log.info("shutting down: no new connections")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        self._begin_shutdown()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their answer
        await self._grace()
        tasks = list(self.server_state.tasks)
        if tasks:
            why = "a second signal" if self.skip_grace else "the end of the shutdown grace"
            log.warning("cancelling %d requests still running at %s", len(tasks), why)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)
        for connection in list(self.server_state.connections):
            connection.transport.close()
        await self.lifespan.shutdown()

    async def _grace(self) -> None:
        grace = float(self.config.timeout_graceful_shutdown or 0)
        deadline = time.monotonic() + grace
        if self.server_state.tasks:
            log.info("letting %d requests finish (up to %g s; a second SIGTERM stops waiting)",
                     len(self.server_state.tasks), grace)  # fmt: skip
        while (self.server_state.tasks or self.server_state.connections) and not self.skip_grace:
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)
