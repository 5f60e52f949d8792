"""One upstream client per deployment (dgxmm.engineclient.pool.UpstreamClients).

Spec (Gateway, "Forwarding"): one client per deployment; a client replaced after a restart on a
new address is closed only when its last stream ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from dgxmm.engineclient.pool import EngineClient, UpstreamClients
from dgxmm.settings import OndemandSettings

OLD = "http://172.18.0.10:8000"
NEW = "http://172.18.0.11:8000"


@asynccontextmanager
async def session(clients: UpstreamClients, dep: str, url: str, **kwargs: int) -> AsyncIterator[EngineClient]:
    """The deployment's client for the duration of one request, as the forwarder holds it."""
    client = clients.begin(dep, url, **kwargs)
    try:
        yield client
    finally:
        clients.end(client)


async def settle() -> None:
    """Let the scheduled close task run (closing is scheduled, not awaited)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


@pytest.fixture
async def clients():
    clients = UpstreamClients(OndemandSettings())
    yield clients
    await clients.close()


async def test_client_is_the_engine_client_of_the_address(clients):
    async with session(clients, "dep-1", OLD) as client:
        assert isinstance(client, EngineClient)
        assert client.base_url == OLD
        assert not client.closed


async def test_client_has_the_spec_pool_and_timeouts(clients):
    async with session(clients, "dep-1", OLD) as client:
        assert client.limit == 256
        assert client.connect_timeout == 10
        assert client.pool_timeout == 60


async def test_a_deployment_may_have_its_own_pool_size(clients):
    async with session(clients, "dep-1", OLD, max_connections=1024) as big, session(clients, "dep-2", OLD) as usual:
        assert big.limit == 1024
        assert usual.limit == 256


async def test_a_new_pool_size_gives_a_new_client(clients):
    async with session(clients, "dep-1", OLD) as old:
        pass
    async with session(clients, "dep-1", OLD, max_connections=512) as new:
        assert new is not old
        assert new.limit == 512
        await settle()
        assert old.closed


async def test_same_base_url_gives_same_session(clients):
    async with session(clients, "dep-1", OLD) as first:
        pass
    async with session(clients, "dep-1", OLD) as second:
        assert second is first
    assert not first.closed


async def test_concurrent_streams_share_the_session(clients):
    async with session(clients, "dep-1", OLD) as first, session(clients, "dep-1", OLD) as second:
        assert second is first


async def test_deployments_get_separate_sessions(clients):
    async with session(clients, "dep-1", OLD) as one, session(clients, "dep-2", OLD) as two:
        assert one is not two


async def test_new_base_url_gives_new_session(clients):
    async with session(clients, "dep-1", OLD) as old:
        pass
    async with session(clients, "dep-1", NEW) as new:
        assert new is not old
        assert not new.closed


async def test_idle_old_session_is_closed_on_switch(clients):
    async with session(clients, "dep-1", OLD) as old:
        pass
    async with session(clients, "dep-1", NEW):
        await settle()
        assert old.closed


async def test_busy_old_session_is_closed_after_its_last_stream(clients):
    async with AsyncExitStack() as stack:
        old = await stack.enter_async_context(session(clients, "dep-1", OLD))
        async with session(clients, "dep-1", NEW) as new:
            assert new is not old
        await settle()
        assert not old.closed  # its stream is still open
        assert not new.closed
    await settle()
    assert old.closed
    assert not new.closed


async def test_busy_old_session_waits_for_all_its_streams(clients):
    async with AsyncExitStack() as first:
        old = await first.enter_async_context(session(clients, "dep-1", OLD))
        async with AsyncExitStack() as second:
            assert await second.enter_async_context(session(clients, "dep-1", OLD)) is old
            async with session(clients, "dep-1", NEW):
                pass
        await settle()
        assert not old.closed  # one stream left
    await settle()
    assert old.closed


async def test_switch_back_to_old_url_gives_a_fresh_session(clients):
    async with session(clients, "dep-1", OLD) as old:
        pass
    async with session(clients, "dep-1", NEW):
        pass
    async with session(clients, "dep-1", OLD) as again:
        assert again is not old
        assert not again.closed


async def test_forget_closes_idle_client_at_once(clients):
    async with session(clients, "dep-1", OLD) as client:
        pass
    clients.forget("dep-1")
    await settle()
    assert client.closed
    assert clients.open_clients() == 0


async def test_forget_closes_busy_client_when_its_last_stream_ends(clients):
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(session(clients, "dep-1", OLD))
        clients.forget("dep-1")
        await settle()
        assert not client.closed
    await settle()
    assert client.closed


async def test_forget_unknown_deployment_is_harmless(clients):
    clients.forget("nope")
    await settle()
    assert clients.open_clients() == 0


async def test_forget_leaves_other_deployments_alone(clients):
    async with session(clients, "dep-1", OLD) as one:
        pass
    async with session(clients, "dep-2", NEW) as two:
        pass
    clients.forget("dep-1")
    await settle()
    assert one.closed
    assert not two.closed
    assert clients.open_clients() == 1


async def test_after_forget_a_new_session_is_made(clients):
    async with session(clients, "dep-1", OLD) as old:
        pass
    clients.forget("dep-1")
    async with session(clients, "dep-1", OLD) as again:
        assert again is not old
        assert not again.closed


async def test_open_clients_counts_live_clients(clients):
    assert clients.open_clients() == 0
    async with session(clients, "dep-1", OLD):
        pass
    async with session(clients, "dep-2", OLD):
        pass
    assert clients.open_clients() == 2


async def test_close_closes_all_clients():
    clients = UpstreamClients(OndemandSettings())
    sessions = []
    for dep in ("dep-1", "dep-2", "dep-3"):
        async with session(clients, dep, OLD) as client:
            sessions.append(client)
    await clients.close()
    assert all(s.closed for s in sessions)
    assert clients.open_clients() == 0


async def test_close_closes_a_client_in_use():
    clients = UpstreamClients(OndemandSettings())
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(session(clients, "dep-1", OLD))
        await clients.close()
        assert client.closed


async def test_close_closes_retired_clients_still_in_use():
    clients = UpstreamClients(OndemandSettings())
    async with AsyncExitStack() as stack:
        old = await stack.enter_async_context(session(clients, "dep-1", OLD))
        async with session(clients, "dep-1", NEW) as new:
            pass
        await clients.close()
        assert new.closed
        assert old.closed  # shutting down: a retired client in use is closed too
