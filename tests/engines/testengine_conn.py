"""The test engine's client connections: counted, and closed the ways real engines close them.

Switches (testengine.py flags), each modelled on a real server:

* ``close_after_stream``: close the connection right after a streamed answer while its headers
  advertise ``Keep-Alive: timeout=5, max=100`` and no ``Connection: close``, as llama-server does
  (cpp-httplib ends a chunked answer by reporting failure, and closes the socket at once).
* ``idle_close``: close a connection that has been idle for that many seconds, without saying so
  in any header, as uvicorn (vLLM, SGLang) does after its 5 s keep-alive timeout. Idle means no
  request in progress since the last answer ended and no byte waiting in the socket (bytes the
  server has read but not yet handed to a handler are not seen: a close can race a request that
  is arriving, as on real servers).
* ``max_requests``: the N-th answer on a connection carries ``Connection: close`` and the
  connection is closed after it, as cpp-httplib does at its keep-alive max count (100).

``counts`` says how often each happened (``GET /_test/connections``), so a test can check that
the misbehaviour it drives really occurred.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

LLAMA_KEEP_ALIVE = "timeout=5, max=100"


@dataclass
class Conn:
    transport: Any
    requests: int = 0
    inflight: int = 0
    last_activity: float = field(default_factory=time.monotonic)


class Connections:
    def __init__(self, close_after_stream: bool, idle_close: float | None, max_requests: int | None) -> None:
        self.close_after_stream = close_after_stream
        self.idle_close = idle_close
        self.max_requests = max_requests
        self.open: dict[int, Conn] = {}  # by id() of aiohttp's per-connection handler
        # most_chats: the most chat completions in progress at once (a gateway's pool bounds it)
        self.counts = {"closed_after_stream": 0, "idle_closed": 0, "capped": 0, "most_chats": 0}
        self.chats = 0

    def track(self, server: Any) -> None:
        """Hook aiohttp's per-connection callbacks. Server.connection_lost keeps a handler listed
        until its task ends, which lags a hang-up; hooking the callbacks counts sockets exactly."""
        made, lost = server.connection_made, server.connection_lost

        def on_made(handler: Any, transport: Any) -> None:
            self.open[id(handler)] = Conn(transport)
            made(handler, transport)

        def on_lost(handler: Any, exc: BaseException | None = None) -> None:
            self.open.pop(id(handler), None)
            lost(handler, exc)

        server.connection_made, server.connection_lost = on_made, on_lost

    @contextlib.contextmanager
    def request(self, request: web.Request) -> Any:
        """Around one request's handling: its connection is busy, and counts one more request."""
        conn = self.open.get(id(request.protocol))
        if conn is None:  # connection already gone
            yield
            return
        conn.requests += 1
        conn.inflight += 1
        chat = request.path == "/v1/chat/completions"
        if chat:
            self.chats += 1
            self.counts["most_chats"] = max(self.counts["most_chats"], self.chats)
        try:
            yield
        finally:
            if chat:
                self.chats -= 1
            conn.inflight -= 1
            conn.last_activity = time.monotonic()

    def prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Just before an answer's head is written (aiohttp's on_response_prepare)."""
        if self.close_after_stream:
            response.headers["Keep-Alive"] = LLAMA_KEEP_ALIVE
        conn = self.open.get(id(request.protocol))
        if self.max_requests is not None and conn is not None and conn.requests >= self.max_requests:
            response.force_close()  # aiohttp closes the connection after this answer
            response.headers["Connection"] = "close"  # (its own header was set before this hook)
            self.counts["capped"] += 1

    def stream_ended(self, request: web.Request) -> None:
        """After a streamed answer's last byte: send the FIN at once, as llama-server does."""
        if not self.close_after_stream or request.transport is None:
            return
        sock = request.transport.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        request.transport.close()
        self.counts["closed_after_stream"] += 1

    async def close_idle(self) -> None:
        """Every 20 ms, close connections idle for ``idle_close`` seconds."""
        if self.idle_close is None:
            return
        while True:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            for conn in list(self.open.values()):
                idle = conn.inflight == 0 and now - conn.last_activity >= self.idle_close
                if idle and not conn.transport.is_closing() and not _readable(conn.transport):
                    conn.transport.close()
                    self.counts["idle_closed"] += 1

    def view(self, asking: web.Request) -> dict[str, int]:
        total = len(self.open)
        return {"open": max(0, total - 1), "total": total, **self.counts}


def _readable(transport: Any) -> bool:
    poller = select.poll()
    poller.register(transport.get_extra_info("socket").fileno(), select.POLLIN)
    return bool(poller.poll(0))
