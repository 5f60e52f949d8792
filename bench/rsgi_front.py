"""dgxmm's ASGI application behind granian's RSGI interface: a benchmark's adapter
(bench/granian_serve.py --interface rsgi), to measure what RSGI's one-call answers are worth.

Each RSGI request becomes an ASGI scope (headers as lowercase bytes, as uvicorn hands them over)
and the app's own ASGI way (for the gateway: ``gateway.asgirequest.AsgiRequest``). A whole
body goes out as one ``protocol.response_bytes`` call (head and body in one write by granian's
Rust side), a streamed one through ``response_stream``. ``receive`` gives the body, then waits
for the protocol's ``client_disconnect()`` (RSGI has no callback for it), which is how the
gateway hears of a hang-up under ASGI.

Not a way to run dgxmm: ``raw_path`` is the path as RSGI gives it, the lifespan is driven
through granian's own ASGI lifespan helper, WebSocket is not served.
"""

from __future__ import annotations

import asyncio
from typing import Any

from granian.asgi import LifespanProtocol


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
        head = scope.method == "HEAD"
        asgi = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": scope.http_version,
            "method": scope.method,
            "scheme": scope.scheme,
            "path": path,
            "raw_path": path.encode(),
            "query_string": scope.query_string.encode("latin-1"),
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()],
            "client": (host, int(port or 0)),
            "server": None,
            "state": self.lifespan.state,
        }
        body_read = False
        answer: dict[str, Any] = {"status": 200, "headers": [], "stream": None}

        async def receive() -> dict[str, Any]:
            nonlocal body_read
            if not body_read:
                body_read = True
                return {"type": "http.request", "body": await protocol(), "more_body": False}
            await protocol.client_disconnect()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["headers"] = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", ())]
                return
            body = message.get("body", b"")
            if answer["stream"] is None:
                if not message.get("more_body", False):
                    protocol.response_bytes(answer["status"], answer["headers"], b"" if head else body)
                    return
                answer["stream"] = protocol.response_stream(answer["status"], answer["headers"])
            if body:
                await answer["stream"].send_bytes(body)

        await self.app(asgi, receive, send)
