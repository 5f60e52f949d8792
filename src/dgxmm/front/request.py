"""One gateway request as dgxmm's front door hands it over: its head, its body, its answer.

The admin API and the web UI are ASGI apps and get uvicorn's ASGI cycle. A request under the
gateway's prefix gets this object instead, because it is the hot path: an ASGI scope, a cycle
with its ``asyncio.Event`` and the ``receive`` and ``send`` callables, then every ASGI message
turned back into bytes, cost about as much CPU as the whole of the rest of a proxied request
(docs/performance.md, "Hot path"). Here the head is what the parser gave (method, path, query,
headers as lowercase names and values, the TCP peer), the body is kept as it arrives, and the
answer is written as bytes (the gateway's side of it: ``ondemand/request.py``):

* ``respond(status, headers, body)``: a whole answer in one write, with its Content-Length.
* ``start(status, headers)``, ``write(chunk)``, ``end(last)``: an answer relayed as it comes,
  chunked unless the headers give a Content-Length (uvicorn's rule). ``write`` waits while the client's side of
  the connection is full, so a slow client slows the engine down and nothing piles up here.
* ``body(limit)``: the whole body, or None once it passes ``limit`` (never more buffered than
  the limit and one read: reading pauses past 64 KiB while nobody reads); ``Expect:
  100-continue`` is answered only then, so a request refused on its head never gets it.
* ``hangup``: run once when the connection is lost before the answer is complete (the gateway
  cancels what the request waits on); ``cut()``: an answer that began cannot be completed, the
  connection is closed so the client sees it cut short.

After a hang-up every write does nothing, as uvicorn's ``send`` does. ``run`` is uvicorn's
``run_asgi`` for this object: an exception before the answer began is a plain 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE

from dgxmm.front.body import ClientGone

if TYPE_CHECKING:
    from dgxmm.front.protocol import FrontDoorProtocol

log = logging.getLogger("uvicorn.error")  # where uvicorn reports an application's failure

MAX_GOOD_NAMES = 512
_GOOD_NAMES: set[bytes] = set()  # answer header names found valid: the same few repeat
FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})  # this object's to write
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
SERVER_ERROR = (b"content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\nconnection: close\r\n\r\n"
                b"Internal Server Error")  # fmt: skip


class FrontRequest:
    __slots__ = ("body_buf", "chunked", "client", "default_headers", "disconnected", "expect_continue", "hangup",
                 "headers", "keep_alive", "left", "method", "more_body", "path", "protocol", "query", "raw_path",
                 "response_complete", "response_started", "transport", "waiter")  # fmt: skip

    def __init__(
        self, protocol: FrontDoorProtocol, method: str, path: str, raw_path: bytes, query: bytes,
        headers: list[tuple[bytes, bytes]], keep_alive: bool, expect_continue: bool,
    ) -> None:  # fmt: skip
        self.protocol = protocol
        self.transport = protocol.transport
        self.default_headers = protocol.server_state.default_headers
        self.method = method
        self.path = path  # percent-decoded, as ASGI's ``path``
        self.raw_path = raw_path
        self.query = query
        self.headers = headers
        self.client = protocol.client
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.body_buf = bytearray()
        self.more_body = True
        self.waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        self.left = 0  # bytes still owed under a Content-Length
        self.hangup: Callable[[], object] | None = None

    # --- fed by the protocol ------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        if self.response_complete:
            return  # the rest of a body whose request was answered: dropped, as uvicorn does
        self.body_buf += body
        if len(self.body_buf) > HIGH_WATER_LIMIT:
            self.protocol.flow.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.more_body = False
        self._wake()

    def lost(self) -> None:
        """The connection is gone."""
        if not self.response_complete:
            self.disconnected = True
        self._wake()
        hangup, self.hangup = self.hangup, None
        if hangup is not None and not self.response_complete:
            hangup()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- the body -----------------------------------------------------------------------------

    async def body(self, limit: int) -> bytes | None:
        """The whole body, or None once more than ``limit`` bytes came; ClientGone on a hang-up."""
        if self.expect_continue:
            self.expect_continue = False
            if not self.transport.is_closing():
                self.transport.write(CONTINUE)
        while True:
            if self.disconnected:
                raise ClientGone
            if len(self.body_buf) > limit:
                return None
            if not self.more_body:
                body = bytes(self.body_buf)
                self.body_buf = bytearray()
                return body
            self.protocol.flow.resume_reading()
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    # --- the answer ---------------------------------------------------------------------------

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """The whole answer in one write; ``Content-Length`` is set here (a length or
        ``Transfer-Encoding`` among ``headers`` is dropped)."""
        head = self._head(status, headers)
        if head is None:
            return
        content = head[0]
        content.append(b"content-length: %d\r\n" % len(body))
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        if self.method != "HEAD":
            content.append(body)
        self.transport.write(b"".join(content))
        self._complete()

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The head of an answer whose body follows in ``write``s: as many bytes as a
        ``Content-Length`` among ``headers`` says, else chunks until ``end`` (a
        ``Transfer-Encoding`` among them is dropped: chunking is this method's)."""
        head = self._head(status, headers)
        if head is None:
            return
        content, length = head
        if length is not None:
            content.append(b"content-length: %d\r\n" % length)
            self.left = length
        elif self.method != "HEAD" and status != 204 and status != 304:
            content.append(b"transfer-encoding: chunked\r\n")
            self.chunked = True
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))

    async def write(self, chunk: bytes) -> None:
        """A piece of the body (nothing for an empty one), once the client's side has room."""
        flow = self.protocol.flow
        if flow.write_paused and not self.disconnected:
            await flow.drain()
        if self.disconnected or not chunk or self.method == "HEAD":
            return
        if self.chunked:
            self.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            return
        if len(chunk) > self.left:
            raise RuntimeError("Response content longer than Content-Length")
        self.left -= len(chunk)
        self.transport.write(chunk)

    async def end(self, last: bytes = b"") -> None:
        """The last piece of the body, and the end of the answer."""
        await self.write(last)
        if self.disconnected:
            return
        if self.chunked:
            self.transport.write(b"0\r\n\r\n")
        elif self.left and self.method != "HEAD":
            raise RuntimeError("Response content shorter than Content-Length")
        self._complete()

    def cut(self) -> None:
        """The answer began but cannot be completed: close the connection (a chunked answer then
        lacks its last chunk, one with a length its bytes, and the client knows it)."""
        self.keep_alive = False
        self.disconnected = True
        self.transport.close()

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> tuple[list[bytes], int | None] | None:
        """The status line and headers (checked as uvicorn checks them; names must be lowercase)
        without the framing ones, which the caller writes, and the ``Content-Length`` among them;
        None after a hang-up. A ``Connection: close`` closes the connection after the answer."""
        if self.response_started:
            raise RuntimeError("the answer began already")
        if self.disconnected:
            return None
        self.response_started = True
        self.expect_continue = False
        content = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            content += (name, b": ", value, b"\r\n")
        values = []
        length: int | None = None
        for name, value in headers:
            if name not in _GOOD_NAMES:
                if HEADER_RE.search(name) or name != name.lower():
                    raise RuntimeError("Invalid HTTP header name.")
                if len(_GOOD_NAMES) < MAX_GOOD_NAMES:
                    _GOOD_NAMES.add(name)
            values.append(value)
            if name in FRAMING:
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.lower().find(b"close") >= 0:
                    self.keep_alive = False
                continue
            content += (name, b": ", value, b"\r\n")
        if HEADER_VALUE_RE.search(b"".join(values)):  # one search: a bad byte is bad wherever it is
            raise RuntimeError("Invalid HTTP header value.")
        return content, length

    def _complete(self) -> None:
        self.response_complete = True
        if not self.keep_alive:
            self.transport.close()
        self.protocol.on_response_complete()

    # --- the task -----------------------------------------------------------------------------

    async def run(self, serve: Callable[[FrontRequest], Awaitable[None]]) -> None:
        """Serve the request; what uvicorn's ``run_asgi`` does for an ASGI app's failures."""
        try:
            await serve(self)
        except BaseException as exc:
            log.error("Exception in the gateway", exc_info=exc)
            self._server_error()
        else:
            if not self.response_started and not self.disconnected:
                log.error("the gateway returned without starting its answer")
                self._server_error()
            elif not self.response_complete and not self.disconnected:
                log.error("the gateway returned without completing its answer")
                self.transport.close()

    def _server_error(self) -> None:
        """A plain 500 when no answer began (and the connection closed), else the connection cut."""
        if self.response_started or self.disconnected:
            self.transport.close()
            return
        self.keep_alive = False
        self.response_started = True
        self.transport.write(STATUS_LINE[500] + SERVER_ERROR)
        self._complete()
