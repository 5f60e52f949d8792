"""One kept-alive HTTP/1.1 connection to an engine, and the answer it carries.

dgxmm's own engine client (the pool is ``pool.EngineClient``): a request is one write of
bytes the gateway already holds whole, the answer is parsed by httptools (llhttp, the parser
uvicorn's server side uses too) straight from the event loop's callbacks. Nothing is built per
request beyond the answer object and one future: aiohttp's client, which this replaces, built
a URL object, a header multidict, a payload, a request and a response object, a writer task and
timers per request, about a fifth of the gateway's CPU per request (docs/performance.md).

The answer's body is kept as the chunks the socket delivered. When the whole answer came in the
same read as its head (the usual case for a non-streaming answer), ``EngineResponse.complete``
is already true when the caller gets it, so it can be passed on in one write. Reading pauses
while more than ``HIGH_WATER`` bytes wait to be passed on (a slow client slows the engine down,
nothing piles up in dgxmm).
"""

from __future__ import annotations

import asyncio
import select
from collections import deque
from typing import Protocol

import httptools

from dgxmm.engineclient.stale import poller_of

HIGH_WATER = 256 * 1024  # bytes of an answer buffered before reading from the engine pauses
# An answer's head (status line and headers) may be at most this, as a request's may at the front
# door: an engine that sends more (a process that took its port, a broken one) is cut off.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100


class Pool(Protocol):
    """What a connection tells its pool (``pool.EngineClient``)."""

    received: int  # reads from the engine: its signs of life (deploy/liveness.py)

    def release(self, conn: EngineConnection, reusable: bool) -> None:
        """An answer is done with ``conn``."""

    def lost(self, conn: EngineConnection) -> None:
        """``conn`` is gone, whoever closed it."""


class EngineDisconnected(ConnectionError):
    """The engine closed the connection (or it broke) before its answer was complete."""


class EngineAborted(EngineDisconnected):
    """dgxmm ended the connection: the engine failed (its watchdog found it hung or dead). The
    message says so in words fit for the caller."""


class EngineResponse:
    """The answer to one request: status and raw headers once the head is in, then the body."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_error",
        "_waiter",
        "complete",
        "headers",
        "last",
        "status",
        "total_bytes",
    )

    def __init__(self, conn: EngineConnection) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.total_bytes = 0
        self.last = b""  # the body bytes ``take`` returned last (how a broken-off answer ended)
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._conn: EngineConnection | None = conn
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    def take(self) -> bytes:
        """The body bytes received so far (nothing is returned twice)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self.last = data
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()
        return data

    async def read_chunk(self) -> bytes:
        """The next bytes of the body as they came; b"" once it is complete. Raises
        ``EngineDisconnected`` if the connection ended before that."""
        while not self._chunks:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.take()

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Done with the answer: its connection goes back to the pool if the answer is complete
        and the connection reusable, else it is closed (an unfinished answer stops the engine's
        work on it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(self)

    # --- fed by the connection ----------------------------------------------------------------

    def _data(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        self.total_bytes += len(data)
        self._wake()

    def _end(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:  # the first cause stands (an abort, then the connection's loss)
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class EngineConnection(asyncio.Protocol):
    """A connection of an ``EngineClient``'s pool; carries one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.poller: select.poll | None = None  # its socket, for ``stale.peer_closed``
        self.parser = httptools.HttpResponseParser(self)
        self.response: EngineResponse | None = None
        self.head: asyncio.Future[EngineResponse] | None = None
        self.closed = False
        self.paused = False
        self.reusable = True
        self.carried_stream = False  # its last request asked for a streamed answer
        self.skip_body = False  # the request was a HEAD: the answer has no body
        self.idle_since = 0.0
        self.head_bytes = 0  # read while the answer's head is coming (with any body bytes after it)
        self.field_bytes = 0  # of the answer's header fields
        self.refusal: str | None = None  # why the answer's head was refused, once it was

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's is a Transport
        self.poller = poller_of(transport)

    def data_received(self, data: bytes) -> None:
        self.pool.received += 1  # a sign of life of the engine (deploy/liveness.py)
        resp = self.response
        if resp is not None and not resp.status:  # its head is still coming
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._refuse(self.refusal or f"the engine's answer cannot be parsed: {exc}")
            return
        # A read may carry the whole head and the body's first bytes: only a head still unfinished
        # past the limit is refused here (``on_header`` holds a head that ends within one read).
        if resp is not None and not resp.status and self.head_bytes > MAX_HEAD_BYTES and not self.closed:
            self._refuse(f"the engine's answer head exceeds {MAX_HEAD_BYTES} bytes")

    def _refuse(self, why: str) -> None:
        self._broken(EngineDisconnected(why))
        if self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool:
        """The engine closed its side. An answer whose body runs to the connection's end (it
        has neither a length nor chunks) is complete now; any other unfinished answer is cut
        short, and ``connection_lost`` fails it. (httptools has no call for the end of input:
        fed ``b""`` it reports an empty piece of body, and completes nothing.)"""
        self.reusable = False
        resp = self.response
        if resp is not None and resp.status and not resp.complete and _runs_to_close(resp.headers):
            resp._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._broken(EngineDisconnected("the engine closed the connection before its answer was complete"))
        self.pool.lost(self)
        # The parser holds this protocol's callbacks and the transport holds the protocol: gone,
        # both are let go, so a closed connection is freed at once, not by the garbage collector
        # (an engine that closes after every stream opens a connection per stream).
        self.transport = None
        del self.parser  # nothing is fed to a closed connection

    # --- parser callbacks ---------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        resp = self.response
        if resp is None:
            return
        resp.headers.append((name, value))
        self.field_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if len(resp.headers) > MAX_HEADERS:
            self.refusal = f"the engine's answer has more than {MAX_HEADERS} header fields"
            raise ValueError(self.refusal)  # stops the parser (see data_received)
        if self.field_bytes > MAX_HEAD_BYTES:
            self.refusal = f"the engine's answer head exceeds {MAX_HEAD_BYTES} bytes"
            raise ValueError(self.refusal)

    def on_headers_complete(self) -> None:
        resp = self.response
        if resp is None:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            resp.headers = []  # an interim answer: the real one follows
            return
        resp.status = status
        if not self.parser.should_keep_alive():
            self.reusable = False
        if self.skip_body:
            self.reusable = False  # the parser would wait for a body a HEAD answer never has
            resp._end()
        head = self.head
        if head is not None and not head.done():
            head.set_result(resp)

    def on_body(self, body: bytes) -> None:
        resp = self.response
        if resp is None or resp.status == 0 or not body:
            return  # (an empty piece would read as the end of the body)
        resp._data(body)
        if resp._buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        resp = self.response
        if resp is None or resp.status == 0:
            return
        resp._end()

    # --- used by the pool and the answer ------------------------------------------------------

    def send(self, data: bytes, *, head_only: bool, body: memoryview | None = None) -> asyncio.Future[EngineResponse]:
        """Write one request (``body``, when given, after ``data``); the future has the answer
        once its head is in."""
        self.skip_body = head_only
        self.head_bytes = self.field_bytes = 0
        self.refusal = None
        self.response = EngineResponse(self)
        self.head = self.loop.create_future()
        self.transport.write(data)  # type: ignore[union-attr]  # sent only once connected
        if body is not None:
            self.transport.write(body)  # type: ignore[union-attr]  # (as above)
        return self.head

    def abort(self, exc: EngineAborted) -> None:
        """dgxmm gives up on the engine: the answer in flight fails with ``exc``, now."""
        self.reusable = False
        self._broken(exc)
        if self.transport is not None:
            self.transport.abort()

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def finished(self, resp: EngineResponse) -> None:
        if resp is not self.response:
            return
        self.response = None
        self.head = None
        if self.paused:
            self.resume()
        self.pool.release(self, resp.complete and self.reusable and not self.closed)

    def _broken(self, exc: BaseException) -> None:
        head, resp = self.head, self.response
        if head is not None and not head.done():
            head.set_exception(exc)
        elif resp is not None and not resp.complete:
            resp._fail(exc)


def _runs_to_close(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether an answer with these headers is delimited by the connection's end (RFC 9112 6.3:
    neither Content-Length nor Transfer-Encoding)."""
    for name, _ in headers:
        lower = name.lower()
        if lower == b"content-length" or lower == b"transfer-encoding":
            return False
    return True
