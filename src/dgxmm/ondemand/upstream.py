"""One upstream HTTP client per deployment, with the spec's pool and timeouts.

256 connections, 10 s to connect, 60 s to wait for a pooled connection, and no read or write
timeout (generation can be long). A deployment restarted on a new address gets a new client;
the old one is closed only when its last stream ends, so no answer in flight is cut off.

No request is lost to a connection the engine closed while it sat in the pool (see
docs/gateway.md, "Connection reuse"): an idle connection is kept at most ``IDLE_S``, below the
5 s after which uvicorn (vLLM, SGLang) and llama-server close theirs; one the engine closed
anyway is found just before the request is written (``staleconn``) and the request goes out
once more on a fresh connection. A connection that ended with ``Connection: close`` is never
reused (aiohttp's own rule), nor one that carried a streamed answer from an engine known to close
after streams: llama-server does so while advertising keep-alive, and any engine is recognised
as such once a connection it closed right after a streamed answer is found in the pool.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp.client_proto import ResponseHandler

from dgxmm.ondemand.staleconn import EXPECT_STREAM, checked_request, nothing_sent
from dgxmm.settings import OndemandSettings

log = logging.getLogger(__name__)

IDLE_S = 3.0  # longest a pooled engine connection stays idle before it is closed, not reused


@dataclass(eq=False)
class EngineClient:
    """The pooled session of one engine address, and what dgxmm has learned about the engine."""

    base_url: str
    settings: OndemandSettings
    closes_after_streams: bool = False
    streams: int = 0
    retired: bool = False
    session: aiohttp.ClientSession = field(init=False)
    _fresh: aiohttp.ClientSession | None = field(default=None, init=False)
    # Connections whose last answer was streamed: one found closed in the pool teaches that the
    # engine closes after streams.
    _after_stream: weakref.WeakSet[ResponseHandler] = field(default_factory=weakref.WeakSet, init=False)

    def __post_init__(self) -> None:
        self.session = self._session(keepalive=True)

    def _session(self, keepalive: bool) -> aiohttp.ClientSession:
        s = self.settings
        limit = s.upstream_max_connections
        connector = (aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=IDLE_S) if keepalive
                     else aiohttp.TCPConnector(limit=limit, limit_per_host=0, force_close=True))  # fmt: skip
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=s.upstream_pool_timeout_s + s.upstream_connect_timeout_s,  # pool wait + connect
            sock_connect=s.upstream_connect_timeout_s,
            sock_read=None,
        )
        return aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",),
            request_class=checked_request(self) if keepalive else aiohttp.ClientRequest,
        )  # fmt: skip

    async def request(
        self, method: str, url: str, body: bytes, headers: list[tuple[str, str]], expect_stream: bool = False
    ) -> aiohttp.ClientResponse:
        """Send one request; resent once, on a fresh connection, only if none of it was sent.
        ``expect_stream``: the request asks for a streamed answer."""
        token = EXPECT_STREAM.set(expect_stream)
        try:
            return await self.session.request(method, url, data=body or None, headers=headers,
                                              allow_redirects=False)  # fmt: skip
        except aiohttp.ClientOSError as exc:
            if not nothing_sent(exc):
                raise
            log.info("engine %s had closed a pooled connection: request sent again on a new one", self.base_url)
            if self._fresh is None:
                self._fresh = self._session(keepalive=False)
            return await self._fresh.request(method, url, data=body or None, headers=headers, allow_redirects=False)
        finally:
            EXPECT_STREAM.reset(token)

    # --- staleconn.Reuse: called by the request class just before each write -------------------

    def stale(self, protocol: ResponseHandler | None) -> None:
        if protocol is not None and protocol in self._after_stream and not self.closes_after_streams:
            self.closes_after_streams = True
            log.warning("engine %s closes its connection after streamed answers: those are no longer reused",
                        self.base_url)  # fmt: skip

    def carries_stream(self, protocol: ResponseHandler) -> None:
        self._after_stream.add(protocol)

    def carries_plain(self, protocol: ResponseHandler) -> None:
        if self._after_stream:
            self._after_stream.discard(protocol)

    @property
    def closed(self) -> bool:
        return self.session.closed

    async def close(self) -> None:
        await self.session.close()
        if self._fresh is not None:
            await self._fresh.close()


class UpstreamClients:
    def __init__(self, settings: OndemandSettings) -> None:
        self._settings = settings
        self._clients: dict[str, EngineClient] = {}
        self._retired: set[EngineClient] = set()  # replaced, still serving their last streams
        self._closing: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def session(
        self, deployment_id: str, base_url: str, closes_after_streams: bool = False
    ) -> AsyncIterator[EngineClient]:
        """The deployment's client for the duration of one stream. ``closes_after_streams``: the
        engine kind is known to close its connection after a streamed answer."""
        client = self._clients.get(deployment_id)
        if client is None or client.base_url != base_url:
            if client is not None:
                self._retire(client)
            client = self._clients[deployment_id] = EngineClient(base_url, self._settings, closes_after_streams)
        client.streams += 1
        try:
            yield client
        finally:
            client.streams -= 1
            if client.retired and client.streams == 0:
                self._retired.discard(client)
                self._close_later(client)

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
