"""dgxmm's ASGI application behind granian's RSGI interface: a benchmark's adapter
(bench/granian_serve.py --interface rsgi), to measure what RSGI's one-call answers are worth.

Each RSGI request becomes an ASGI scope (headers as lowercase bytes, as uvicorn hands them over)
with a cycle under the front door's extension key, so the gateway answers a whole response
through ``respond``: one ``protocol.response_bytes`` call, head and body in one write by
granian's Rust side. Anything else goes through ``send``: a whole body as ``response_bytes``,
a streamed one through ``response_stream``. A hang-up is watched by a task on the protocol's
``client_disconnect()`` (RSGI has no callback for it), which calls the cycle's ``hangup``.

Not a way to run dgxmm: ``raw_path`` is the path as RSGI gives it, the lifespan is driven
through granian's own ASGI lifespan helper, WebSocket is not served.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from granian.asgi import LifespanProtocol

from dgxmm.front.cycle import FRONT


class RSGICycle:
    """What the gateway reads through ``scope["extensions"][FRONT]``: ``disconnected``, ``hangup``,
    ``respond`` and ``whole_body``."""

    __slots__ = ("protocol", "disconnected", "hangup", "started", "stream", "status", "headers", "head", "__weakref__")

    def __init__(self, protocol: Any, head: bool) -> None:
        self.protocol = protocol
        self.disconnected = False
        self.hangup: Callable[[], object] | None = None
        self.started = False
        self.stream: Any = None
        self.status = 200
        self.headers: list[tuple[str, str]] = []
        self.head = head

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.started:
            raise RuntimeError("respond() after the answer began")
        if self.disconnected:
            return
        self.started = True
        out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers
               if k != b"content-length" and k != b"transfer-encoding"]  # fmt: skip
        self.protocol.response_bytes(status, out, b"" if self.head else body)

    def whole_body(self) -> bytes | None:
        """None: the body is read through ``receive`` (one ``await protocol()``)."""
        return None

    def gone(self, _: object) -> None:
        self.disconnected = True
        hangup, self.hangup = self.hangup, None
        if hangup is not None:
            hangup()


class RSGIFront:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.lifespan = LifespanProtocol(app)

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.lifespan.startup())
        if self.lifespan.interrupt:
            raise RuntimeError("dgxmm's start-up failed")

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.lifespan.shutdown())

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        host, _, port = scope.client.rpartition(":")
        path: str = scope.path
        cycle = RSGICycle(protocol, scope.method == "HEAD")
        asgi = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": scope.http_version,
            "method": scope.method, "scheme": scope.scheme, "path": path, "raw_path": path.encode(),
            "query_string": scope.query_string.encode("latin-1"), "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()],
            "client": (host, int(port or 0)), "server": None, "state": self.lifespan.state,
            "extensions": {FRONT: weakref.ref(cycle)},  # as dgxmm's front door: the gateway reads it with front_of
        }  # fmt: skip
        body_read = False

        async def receive() -> dict[str, Any]:
            nonlocal body_read
            if not body_read:
                body_read = True
                return {"type": "http.request", "body": await protocol(), "more_body": False}
            await protocol.client_disconnect()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                cycle.status = message["status"]
                cycle.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", ())]
                return
            body = message.get("body", b"")
            if cycle.stream is None:
                if not message.get("more_body", False):
                    cycle.started = True
                    protocol.response_bytes(cycle.status, cycle.headers, b"" if cycle.head else body)
                    return
                cycle.started = True
                cycle.stream = protocol.response_stream(cycle.status, cycle.headers)
            if body:
                await cycle.stream.send_bytes(body)

        watcher = asyncio.ensure_future(protocol.client_disconnect())
        watcher.add_done_callback(cycle.gone)
        try:
            await self.app(asgi, receive, send)
        finally:
            watcher.remove_done_callback(cycle.gone)
            watcher.cancel()
