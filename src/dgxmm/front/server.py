"""The one HTTP server of dgxmm, as ``dgxmm serve`` runs it and as the tests run it in-process.

``build_server`` makes the uvicorn server with dgxmm's protocol (``protocol``), its limits, and
the settings no one may change: proxy-header rewriting off (the gateway's peer guard must see
the raw TCP peer), no ``Server`` header, no WebSocket. ``listen`` binds the port before the
application starts, so a port in use stops start-up before any engine is touched; with
``[ollama] listen`` a second socket (``listeners``), served by the same server and application,
which answers on it Ollama's API only (``asgi.OndemandFront``, by the connection's local port).

``DgxmmServer`` extends uvicorn's shutdown on SIGTERM or SIGINT with what dgxmm needs: before
uvicorn stops accepting, the application is told (every waiting request gets 503 now, nothing
starts any more); then uvicorn's own shutdown lets requests in flight finish for up to
``[server] shutdown_grace_s`` and cancels what is left. A second SIGTERM or SIGINT ends the
grace at once (uvicorn's own rule covers SIGINT only); what is still running is cancelled and
given a moment to unwind, and the application's shutdown (engines stopped and recorded) runs
then too, where uvicorn would skip it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import uvicorn

from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits
from dgxmm.front.protocol import FrontConfig
from dgxmm.settings import ServerSettings, Settings

log = logging.getLogger(__name__)

BACKLOG = 2048
CANCEL_WAIT_S = 5.0  # how long cancelled requests may take to unwind after the grace


def listen(server: ServerSettings) -> socket.socket:
    """The listening socket (not inherited by engines); raises OSError if the port is taken."""
    return _bound(server.host, server.port)


class CannotListen(Exception):
    """A listener's address cannot be bound: ``where`` names it and the setting that sets it."""

    def __init__(self, where: str, error: OSError) -> None:
        super().__init__(f"cannot listen on {where}: {os.strerror(error.errno) if error.errno else error}")


def listeners(settings: Settings) -> list[socket.socket]:
    """The main listening socket, then Ollama's own (``[ollama] listen``) where set; one that
    cannot be bound closes those bound before it and raises ``CannotListen``."""
    server = settings.server
    try:
        main = listen(server)
    except OSError as exc:
        raise CannotListen(f"{server.host}:{server.port}", exc) from None
    address = settings.ollama.address
    if address is None:
        return [main]
    try:
        return [main, _bound(*address)]
    except OSError as exc:
        main.close()
        raise CannotListen(f"{settings.ollama.listen} (ollama.listen)", exc) from None


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=BACKLOG)


class Served(Protocol):
    """What the server needs of the application besides being ASGI: the limits its connections
    keep, their budget, and the first step of its shutdown."""

    limits: FrontLimits
    budget: ConnectionBudget

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None: ...

    def begin_shutdown(self) -> None: ...


def build_server(settings: Settings, app: Served) -> DgxmmServer:
    server = settings.server
    config = FrontConfig(
        app,
        limits=app.limits,
        budget=app.budget,
        host=server.host,
        port=server.port,
        ws="none",
        lifespan="on",
        # The gateway's peer guard must see the raw TCP peer: never rewrite it from headers.
        proxy_headers=False,
        forwarded_allow_ips="",
        server_header=False,
        log_level=server.log_level,
        # Uvicorn's lines go through dgxmm's handler (text or JSON, logs.py); its access
        # log is replaced by dgxmm's, which never writes the query string.
        log_config=None,
        access_log=False,
        backlog=BACKLOG,
        timeout_keep_alive=app.limits.keep_alive_s,
        timeout_graceful_shutdown=server.shutdown_grace_s,
    )
    return DgxmmServer(config, app.begin_shutdown)


class DgxmmServer(uvicorn.Server):
    def __init__(self, config: FrontConfig, begin_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self.front = config
        self._begin_shutdown = begin_shutdown

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and not self.force_exit:
            log.warning("second %s: not waiting for requests in flight", signal.Signals(sig).name)
            self.force_exit = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._begin_shutdown()
        if self.server_state.tasks:
            log.info(
                "letting %d requests finish (up to %g s; a second SIGTERM stops waiting)",
                len(self.server_state.tasks),
                float(self.config.timeout_graceful_shutdown or 0),
            )
        await super().shutdown(sockets)
        tasks = [task for task in self.server_state.tasks if not task.done()]
        if tasks:
            log.warning(
                "cancelling %d requests still running at %s",
                len(tasks),
                "a second signal" if self.force_exit else "the end of the shutdown grace",
            )
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)
        if self.force_exit:  # uvicorn skips the application's shutdown then: dgxmm's engines need it
            await self.lifespan.shutdown()
