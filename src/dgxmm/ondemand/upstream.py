"""One upstream HTTP client per deployment, with the spec's pool and timeouts.

256 connections, 10 s to connect, 60 s to wait for a pooled connection, and no read or write
timeout (generation can be long). A deployment restarted on a new address gets a new client;
the old one is closed only when its last stream ends, so no answer in flight is cut off.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

from dgxmm.settings import OndemandSettings


@dataclass(eq=False)
class _Client:
    base_url: str
    session: aiohttp.ClientSession
    streams: int = 0
    retired: bool = False


class UpstreamClients:
    def __init__(self, settings: OndemandSettings) -> None:
        self._settings = settings
        self._clients: dict[str, _Client] = {}
        self._retired: set[_Client] = set()  # replaced, still serving their last streams
        self._closing: set[asyncio.Task[None]] = set()

    def _new(self, base_url: str) -> _Client:
        s = self._settings
        connector = aiohttp.TCPConnector(limit=s.upstream_max_connections, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=s.upstream_pool_timeout_s + s.upstream_connect_timeout_s,  # pool wait + connect
            sock_connect=s.upstream_connect_timeout_s,
            sock_read=None,
        )
        session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        return _Client(base_url, session)

    @asynccontextmanager
    async def session(self, deployment_id: str, base_url: str) -> AsyncIterator[aiohttp.ClientSession]:
        """The deployment's client for the duration of one stream."""
        client = self._clients.get(deployment_id)
        if client is None or client.base_url != base_url:
            if client is not None:
                self._retire(client)
            client = self._clients[deployment_id] = self._new(base_url)
        client.streams += 1
        try:
            yield client.session
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

    def _retire(self, client: _Client) -> None:
        client.retired = True
        if client.streams == 0:
            self._close_later(client)
        else:
            self._retired.add(client)

    def _close_later(self, client: _Client) -> None:
        task = asyncio.get_running_loop().create_task(client.session.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def open_clients(self) -> int:
        """Clients not yet closed (tests check that retired ones go away)."""
        return sum(1 for c in self._clients.values() if not c.session.closed)

    async def close(self) -> None:
        for client in [*self._clients.values(), *self._retired]:
            await client.session.close()
        self._clients.clear()
        self._retired.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
