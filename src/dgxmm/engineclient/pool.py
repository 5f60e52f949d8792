"""One engine client per deployment: its pool of kept-alive connections to the engine.

Each deployment gets a client for its engine's address: at most ``upstream_max_connections``
connections (256, the spec's value, or the deployment's own ``upstream_max_connections``), 10 s
to connect, 60 s to wait for a pooled connection, and no read or write timeout (generation can be
long). A deployment restarted on a new address gets a new client; the old one is closed only when
its last stream ends, so no answer in flight is cut off.

No request is lost to a connection the engine closed while it sat in the pool (see
docs/gateway.md, "Connection reuse"): an idle connection is kept at most ``IDLE_S``, below the
5 s after which uvicorn (vLLM, SGLang) and llama-server close theirs; one the engine closed
anyway is found just before the request is written (``stale.peer_closed``), closed, and the
request goes out on another connection: not a byte of it was written to the closed one. Every
failure after the write is ambiguous (the engine may have read the request and begun
generating), so a request is never written twice. A connection whose answer ended with
``Connection: close`` is never reused, nor one that carried a streamed answer from an engine known
to close after streams: llama-server does so while advertising keep-alive. What an engine of
another kind does after a streamed answer is learnt, and until it is, such a connection is
*parked*: never handed out, for ``SETTLE_S``. If the engine closes it meanwhile, the engine closes
after streams; if it is still open then, it keeps them, and the connection joins the pool. Its
close can come any time after the answer's last byte (under load, milliseconds later), so a
connection handed out at once could take a request the engine would then drop unread.

The connections themselves are ``connection.EngineConnection`` (httptools on asyncio protocols).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import deque
from urllib.parse import urlsplit

from dgxmm.engineclient.connection import EngineAborted, EngineConnection, EngineResponse
from dgxmm.engineclient.stale import peer_closed
from dgxmm.settings import OndemandSettings

log = logging.getLogger(__name__)

IDLE_S = 3.0  # longest a pooled engine connection stays idle before it is closed, not reused
SETTLE_S = 1.0  # how long a connection is parked after a streamed answer, while the engine is unknown
SEPARATE_BODY = 64 * 1024  # a body larger than this is written on its own, not joined to the head


class PoolTimeout(TimeoutError):
    """No pooled connection came free within ``upstream_pool_timeout_s``."""


class EngineClient:
    """The pooled connections to one engine address, and what dgxmm has learned about the engine."""

    def __init__(
        self,
        base_url: str,
        settings: OndemandSettings,
        closes_after_streams: bool = False,
        max_connections: int | None = None,
        api_key: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an http:// engine address: {base_url}")
        self.base_url = base_url
        self.settings = settings
        self.closes_after_streams = closes_after_streams
        self.keeps_after_streams = False  # learnt: a parked connection outlived SETTLE_S
        self.limit = max_connections or settings.upstream_max_connections
        self.connect_timeout = settings.upstream_connect_timeout_s
        self.pool_timeout = settings.upstream_pool_timeout_s
        self.streams = 0  # requests using this client now (UpstreamClients' count)
        self.retired = False
        self.received = 0  # reads from the engine, on any connection: its signs of life
        self._host, self._port = parts.hostname, parts.port or 80
        self.api_key = api_key
        # Host, and the key this run of the engine demands (each request carries it)
        self._host_line = b"host: " + parts.netloc.encode("ascii") + b"\r\n"
        if api_key:
            self._host_line += b"authorization: Bearer " + api_key.encode("ascii") + b"\r\n"
        self._open = 0  # connections open or being opened: at most ``limit``
        self._conns: set[EngineConnection] = set()
        self._idle: list[EngineConnection] = []  # the most recently used last
        self._parked: dict[EngineConnection, asyncio.TimerHandle] = {}  # after a stream, engine unknown
        self._waiters: deque[asyncio.Future[EngineConnection | None]] = deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_connections(self) -> int:
        return self._open

    async def request(
        self, method: str, target: str, body: bytes | bytearray, headers: bytes, expect_stream: bool = False
    ) -> EngineResponse:
        """Send one request (``headers``: its header lines, each ending in CRLF, without Host and
        Content-Length, which are added); returns the answer once its head is in.
        ``expect_stream``: the request asks for a streamed answer. Raises OSError
        (``EngineDisconnected`` among them) or TimeoutError; the answer must be closed."""
        if self._closed:
            raise ConnectionError("the engine client is closed")
        length = b"" if not body and method in ("GET", "HEAD") else b"content-length: %d\r\n" % len(body)
        # A large body goes in a write of its own, as a view: joined to the head it would be held
        # twice until the answer's head came (a body may be 16 MiB, four of them at once).
        large = len(body) > SEPARATE_BODY
        data = b"".join(
            (
                method.encode("ascii"),
                b" ",
                target.encode("ascii"),
                b" HTTP/1.1\r\n",
                self._host_line,
                headers,
                length,
                b"\r\n",
                b"" if large else body,
            )
        )
        conn = self._pooled()
        if conn is None:
            conn = await self._new_or_handed()
        if not expect_stream:
            conn.carried_stream = False
        elif self.closes_after_streams:
            conn.reusable = False  # not pooled again when the answer ends
        else:
            conn.carried_stream = True
        head = conn.send(data, head_only=method == "HEAD", body=memoryview(body) if large else None)
        try:
            return await head
        except BaseException:
            conn.reusable = False
            if conn.response is not None:
                conn.response.close()
            raise

    # --- the pool -----------------------------------------------------------------------------

    def _pooled(self) -> EngineConnection | None:
        """The most recently used idle connection that the engine has not closed, or None."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed and not peer_closed(conn):
                return conn
            self._stale(conn)
        return None

    def _stale(self, conn: EngineConnection) -> None:
        """A pooled connection the engine closed: never written to."""
        if conn.carried_stream and not self.closes_after_streams:
            self.closes_after_streams = True
            log.warning(
                "engine %s closes its connection after streamed answers: those are no longer reused", self.base_url
            )
        log.info("engine %s had closed a pooled connection: the request goes on another one", self.base_url)
        conn.reusable = False
        if conn.transport is not None:
            conn.transport.close()

    async def _new_or_handed(self) -> EngineConnection:
        """A new connection when the pool has room, else the next one released (checked like a
        pooled one) or room for a new one, waiting up to the pool timeout."""
        while True:
            if self._open < self.limit and not self._waiters:
                self._open += 1
                return await self._connect()
            waiter: asyncio.Future[EngineConnection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self._unpark_one()  # a parked connection gives way to a new one
            self._wake_one()  # room may be free already (behind waiters that went away)
            try:
                async with asyncio.timeout(self.pool_timeout):
                    conn = await waiter
            except TimeoutError:
                raise PoolTimeout(f"no connection to the engine came free within {self.pool_timeout:g} s") from None
            except BaseException:
                self._abandon(waiter)
                raise
            if conn is None:  # room for one more: reserved for this request
                return await self._connect()
            if not conn.closed and not peer_closed(conn):
                return conn
            self._stale(conn)

    def _abandon(self, waiter: asyncio.Future[EngineConnection | None]) -> None:
        """A waiting request went away: pass on what it was handed meanwhile."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        elif waiter.done() and not waiter.cancelled():
            conn = waiter.result()
            if conn is None:
                self._open -= 1
                self._wake_one()
            else:
                self.release(conn, True)

    async def _connect(self) -> EngineConnection:
        """Open a connection (its place in ``_open`` is already taken)."""
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await asyncio.get_running_loop().create_connection(
                    lambda: EngineConnection(self), self._host, self._port
                )
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise
        if self._closed:
            conn.transport.close()  # type: ignore[union-attr]  # a new connection is connected
            raise ConnectionError("the engine client is closed")
        self._conns.add(conn)
        return conn

    def release(self, conn: EngineConnection, reusable: bool) -> None:
        """An answer is done with ``conn``: to the next waiter, into the pool, or closed."""
        if not reusable or self._closed or conn.closed or (conn.carried_stream and self.closes_after_streams):
            if conn.transport is not None:
                conn.transport.close()  # ``lost`` frees its place
            return
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        if conn.carried_stream and not self.keeps_after_streams:
            self._parked[conn] = loop.call_at(conn.idle_since + SETTLE_S, self._settled, conn)
            if self._waiters:
                self._unpark_one()
            return
        self._offer(conn)

    def _offer(self, conn: EngineConnection) -> None:
        """An open, reusable connection: to the first waiter, else into the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._pool(conn)

    def _pool(self, conn: EngineConnection) -> None:
        """Into the idle pool, kept in order of ``idle_since`` (the sweep closes from the front)."""
        idle = self._idle
        if idle and idle[-1].idle_since > conn.idle_since:
            bisect.insort(idle, conn, key=lambda c: c.idle_since)
        else:
            idle.append(conn)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_at(conn.idle_since + IDLE_S, self._close_idle)

    def _settled(self, conn: EngineConnection) -> None:
        """A parked connection is still open ``SETTLE_S`` after its streamed answer: this engine
        keeps connections after streams. It joins the pool (idle since its answer ended)."""
        if self._parked.pop(conn, None) is None or conn.closed or self._closed:
            return
        if not self.keeps_after_streams and not self.closes_after_streams:
            self.keeps_after_streams = True
            log.info("engine %s keeps its connections after streamed answers: they are reused", self.base_url)
        conn.carried_stream = False  # a close found later is an idle one, not one after a stream
        self._offer(conn)

    def _unpark_one(self) -> None:
        """The pool is full and a request waits: the oldest parked connection is closed by
        dgxmm (so it teaches nothing), which frees its place for a new one."""
        if self._open < self.limit or not self._parked:
            return
        conn = next(iter(self._parked))
        self._parked.pop(conn).cancel()
        conn.reusable = False
        if conn.transport is not None:
            conn.transport.close()

    def lost(self, conn: EngineConnection) -> None:
        """``conn`` is gone (whoever closed it): its place is free."""
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        self._open -= 1
        if conn in self._idle:
            self._idle.remove(conn)
        parked = self._parked.pop(conn, None)
        if parked is not None:  # the engine closed it after its streamed answer
            parked.cancel()
            if not self.closes_after_streams:
                self.closes_after_streams = True
                log.warning(
                    "engine %s closes its connection after streamed answers: those are no longer reused", self.base_url
                )
        self._wake_one()

    def _wake_one(self) -> None:
        """A place came free: the first waiter may open a connection."""
        while self._waiters and self._open < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._open += 1
                waiter.set_result(None)
                return

    def _close_idle(self) -> None:
        """Close connections idle for ``IDLE_S`` (the oldest are first in the list)."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        idle = self._idle
        while idle and now - idle[0].idle_since >= IDLE_S:
            conn = idle.pop(0)
            conn.reusable = False
            if conn.transport is not None:
                conn.transport.close()
        if idle:
            self._sweep = loop.call_at(idle[0].idle_since + IDLE_S, self._close_idle)

    def abort(self, reason: str) -> None:
        """The engine failed (hung or dead): every answer in flight and every request waiting
        for a connection fails now with ``EngineAborted(reason)``, and no connection is used
        again. A hung engine reads nothing, so its connections are dropped, not closed."""
        self._closed = True
        error = EngineAborted(reason)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self._waiters.clear()
        for conn in list(self._conns):
            conn.abort(error)

    async def close(self) -> None:
        """Close every connection, in use or not; waiting requests fail."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._idle.clear()
        for timer in self._parked.values():
            timer.cancel()
        self._parked.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionError("the engine client is closed"))
        self._waiters.clear()
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.close()
        await asyncio.sleep(0)  # let the transports report their end


class UpstreamClients:
    """The engine client of each deployment, replaced when its address or pool size changes."""

    def __init__(self, settings: OndemandSettings) -> None:
        self._settings = settings
        self._clients: dict[str, EngineClient] = {}
        self._retired: set[EngineClient] = set()  # replaced, still serving their last streams
        self._closing: set[asyncio.Task[None]] = set()

    def begin(
        self,
        deployment_id: str,
        base_url: str,
        closes_after_streams: bool = False,
        max_connections: int | None = None,
        api_key: str | None = None,
    ) -> EngineClient:
        """The deployment's client for one request; ``end`` must follow. ``closes_after_streams``:
        the engine kind is known to close its connection after a streamed answer;
        ``max_connections``: the deployment's own pool size (None: the setting's); ``api_key``:
        the key the engine demands (a new run of the engine has a new one)."""
        client = self._clients.get(deployment_id)
        limit = max_connections or self._settings.upstream_max_connections
        if client is None or client.base_url != base_url or client.limit != limit or client.api_key != api_key:
            if client is not None:
                self._retire(client)
            client = self._clients[deployment_id] = EngineClient(
                base_url, self._settings, closes_after_streams, limit, api_key
            )
        client.streams += 1
        return client

    def end(self, client: EngineClient) -> None:
        client.streams -= 1
        if client.retired and client.streams == 0:
            self._retired.discard(client)
            self._close_later(client)

    def in_flight(self, deployment_id: str) -> int:
        """Requests the gateway is forwarding to the deployment's engine now, always-on ones
        included (the controller counts only on-demand slots)."""
        client = self._clients.get(deployment_id)
        return 0 if client is None else client.streams

    def received(self, deployment_id: str) -> tuple[int, int]:
        """The deployment's engine client and its reads so far: a change is a sign of life."""
        client = self._clients.get(deployment_id)
        return (0, 0) if client is None else (id(client), client.received)

    def abort(self, deployment_id: str, reason: str) -> None:
        """The deployment's engine failed: end its requests now (``EngineClient.abort``); the
        next request, to the engine started after it, gets a new client."""
        client = self._clients.pop(deployment_id, None)
        if client is not None:
            client.abort(reason)
            self._retire(client)

    def forget(self, deployment_id: str) -> None:
        """The deployment is gone: retire its client (closed once its streams end)."""
        client = self._clients.pop(deployment_id, None)
        if client is not None:
            self._retire(client)

    def _retire(self, client: EngineClient) -> None:
        client.retired = True
        if client.streams == 0:
            self._close_later(client)
        else:
            self._retired.add(client)

    def _close_later(self, client: EngineClient) -> None:
        task = asyncio.get_running_loop().create_task(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def open_clients(self) -> int:
        """Clients not yet closed (tests check that retired ones go away)."""
        return sum(1 for c in self._clients.values() if not c.closed)

    async def close(self) -> None:
        for client in [*self._clients.values(), *self._retired]:
            await client.close()
        self._clients.clear()
        self._retired.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
