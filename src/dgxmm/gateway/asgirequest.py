"""A gateway request, as it comes through ASGI, in the shape the gateway reads (``request.py``).

Every gateway request is one of these, under dgxmm's own server or any other ASGI server. A whole
answer is two messages (head, then body); a hang-up is noticed by a task that watches
``receive`` once the body is in, and runs ``hangup``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

from dgxmm.front.body import BodyBudget, read_buffer
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.request import OPENAI, Dialect


class AsgiRequest:
    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.raw_path: bytes = scope.get("raw_path") or self.path.encode()
        self.query: bytes = scope.get("query_string", b"")
        self.headers: list[tuple[bytes, bytes]] = scope["headers"]
        self.client: tuple[str, int] | None = scope.get("client")
        self.disconnected = False
        self.response_started = False
        self.hangup: Callable[[], object] | None = None
        self.dialect: Dialect = OPENAI
        self.exchange: Exchange | None = None
        self._receive = receive
        self._send = send
        self._watcher: asyncio.Task[None] | None = None

    async def body(
        self, limit: int, *, timeout_s: float | None = None, budget: BodyBudget | None = None
    ) -> bytearray | None:
        body = await read_buffer(self._receive, limit, timeout_s=timeout_s, budget=budget)
        if body is not None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return body

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        hangup, self.hangup = self.hangup, None
        if hangup is not None:
            hangup()

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        kept = [(k, v) for k, v in headers if k != b"content-length"]
        await self.start(status, [*kept, (b"content-length", b"%d" % len(body))])
        await self.end(body)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Framed by the server: by a Content-Length among ``headers``, else in chunks."""
        if self.response_started:
            raise RuntimeError("the answer began already")
        self.response_started = True
        kept = [(k, v) for k, v in headers if k != b"transfer-encoding"]
        await self._send({"type": "http.response.start", "status": status, "headers": kept})

    async def write(self, chunk: bytes) -> None:
        if chunk:
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end(self, last: bytes = b"") -> None:
        await self._send({"type": "http.response.body", "body": last})
        self.close()

    def cut(self) -> None:
        """Under ASGI the server ends an answer the application gives up on: raise to it."""
        self.close()
        raise ConnectionAbortedError("the answer was cut short")

    def close(self) -> None:
        """The request is done: stop watching for the hang-up."""
        self.hangup = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
