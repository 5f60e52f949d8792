"""No request lost to a pooled engine connection, none sent twice (dgxmm.engineclient.pool).

Against a raw engine on real sockets (tests/unit/rawengine.py) whose connections the test closes
at chosen moments. The hard case is a connection the engine closed while it sat in the pool,
with the FIN already in the kernel but not yet read by the event loop: the test waits for it
with blocking calls, so its loop cannot run, and only then sends the next request.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from conftest import wait_until
from unit.rawengine import Engine, Plan

from dgxmm.engineclient import pool as upstream
from dgxmm.engineclient.connection import EngineDisconnected
from dgxmm.engineclient.pool import EngineClient, PoolTimeout
from dgxmm.settings import OndemandSettings

BODY = b'{"model": "m", "messages": []}'


def headers(seq: str) -> bytes:
    return b"content-type: application/json\r\nx-seq: %b\r\n" % seq.encode()


async def call(client: EngineClient, engine: Engine, seq: str, stream: bool = False) -> bytes:
    resp = await client.request("POST", "/v1/chat/completions", BODY, headers(seq), stream)
    try:
        assert resp.status == 200
        return await resp.read()
    finally:
        resp.close()


@pytest.fixture
def engine():
    engine = Engine()
    yield engine
    engine.stop()


@pytest.fixture
async def client(engine: Engine):
    client = EngineClient(engine.url, OndemandSettings())
    yield client
    await client.close()


def wait_for_fin(engine: Engine) -> None:
    """Block (the loop does not run) until the engine closed its side and the FIN is here."""
    assert engine.closed.wait(5)
    block_loop(0.05)


def block_loop(seconds: float) -> None:
    """Sleep without letting the event loop run: what arrives meanwhile stays unread."""
    time.sleep(seconds)


async def test_a_pooled_connection_is_reused(client: EngineClient, engine: Engine) -> None:
    await call(client, engine, "1")
    await call(client, engine, "2")
    assert [s.conn for s in engine.seen] == [0, 0]


async def test_a_connection_closed_in_the_pool_is_never_written_to(client: EngineClient, engine: Engine) -> None:
    await call(client, engine, "1")
    engine.close_conn(0)
    wait_for_fin(engine)
    await call(client, engine, "2")  # the pool still offers connection 0: its FIN is unread
    assert engine.seqs() == ["1", "2"]  # written once, to a new connection
    assert [s.conn for s in engine.seen] == [0, 1]
    assert client.open_connections == 1  # the closed one is gone from the pool


async def test_a_request_the_engine_read_is_never_sent_again(client: EngineClient, engine: Engine) -> None:
    """Closed after the request was read, before any answer byte: the engine may be generating."""
    engine.plan = lambda seq: Plan(hang_up=seq == "2")
    await call(client, engine, "1")
    with pytest.raises(EngineDisconnected):
        await call(client, engine, "2")
    await asyncio.sleep(0.1)  # (a negative check: a slow machine can only hide a resend, never fail it)
    assert engine.seqs() == ["1", "2"]


async def test_connection_close_from_the_engine_is_honoured(client: EngineClient, engine: Engine) -> None:
    engine.plan = lambda seq: Plan(connection_close=seq == "1")  # the engine keeps the socket open
    await call(client, engine, "1")
    await call(client, engine, "2")
    assert [s.conn for s in engine.seen] == [0, 1]


async def test_a_stream_from_an_engine_known_to_close_after_streams_is_not_pooled(engine: Engine) -> None:
    client = EngineClient(engine.url, OndemandSettings(), closes_after_streams=True)
    engine.plan = lambda seq: Plan(stream=seq in ("1", "3"))  # the engine keeps every socket open
    # 1 on connection 0 (not pooled), 2 on 1 (pooled), 3 on 1 again (then not pooled), 4 on 2
    try:
        assert (await call(client, engine, "1", stream=True)).endswith(b"data: [DONE]\n\n")
        await call(client, engine, "2")
        await call(client, engine, "3", stream=True)
        await call(client, engine, "4")
    finally:
        await client.close()
    assert [s.conn for s in engine.seen] == [0, 1, 1, 2]


async def test_an_engine_closing_after_streams_is_recognised(client: EngineClient, engine: Engine) -> None:
    engine.plan = lambda seq: Plan(stream=True, close_after=seq == "1")
    await call(client, engine, "1", stream=True)
    block_loop(0.05)  # the FIN is here; the loop has not read it
    await call(client, engine, "2", stream=True)  # the pool offers connection 0, found closed
    assert client.closes_after_streams
    await call(client, engine, "3", stream=True)  # the engine keeps connection 2 open this time ...
    await call(client, engine, "4")  # ... but it carried a stream: not reused
    await call(client, engine, "5")
    assert engine.seqs() == ["1", "2", "3", "4", "5"]
    assert [s.conn for s in engine.seen] == [0, 1, 2, 3, 3]


async def test_a_connection_is_parked_after_a_stream_until_the_engine_is_known(
    client: EngineClient, engine: Engine
) -> None:
    """The engine's close after a streamed answer may come well after the answer's last byte (a
    busy machine): the next request must not be written to that connection meanwhile."""
    closing = threading.Event()
    engine.plan = lambda seq: Plan(stream=seq == "1", close_after=seq == "1", close_when=closing)
    await call(client, engine, "1", stream=True)  # answered whole; the engine has not closed yet
    await call(client, engine, "2")  # not on connection 0, which the engine is about to drop
    closing.set()
    await wait_until(lambda: client.closes_after_streams)  # learnt from the parked connection's close
    await call(client, engine, "3", stream=True)
    await call(client, engine, "4")
    assert engine.seqs() == ["1", "2", "3", "4"]
    assert [s.conn for s in engine.seen] == [0, 1, 1, 2]  # 3 carried a stream: not reused


async def test_an_engine_keeping_connections_after_streams_is_recognised(engine: Engine, monkeypatch) -> None:
    monkeypatch.setattr(upstream, "SETTLE_S", 0.1)
    client = EngineClient(engine.url, OndemandSettings())
    engine.plan = lambda seq: Plan(stream=seq in ("1", "3"))  # the engine keeps every socket open
    try:
        await call(client, engine, "1", stream=True)
        await call(client, engine, "2")  # connection 0 is parked: a new one
        await wait_until(lambda: client.keeps_after_streams)
        assert not client.closes_after_streams
        await call(client, engine, "3", stream=True)  # the most recently used: 1
        await call(client, engine, "4")  # known now: reused at once
    finally:
        await client.close()
    assert [s.conn for s in engine.seen] == [0, 1, 1, 1]


async def test_a_parked_connection_gives_way_when_the_pool_is_full(engine: Engine, monkeypatch) -> None:
    """With every place taken by parked connections, a request does not wait for them to settle."""
    monkeypatch.setattr(upstream, "SETTLE_S", 600)
    client = EngineClient(engine.url, OndemandSettings(), max_connections=1)
    engine.plan = lambda seq: Plan(stream=seq == "1")
    try:
        await call(client, engine, "1", stream=True)
        async with asyncio.timeout(10):
            await call(client, engine, "2")
        assert client.open_connections == 1
        assert not client.closes_after_streams and not client.keeps_after_streams  # dgxmm closed it: no lesson
    finally:
        await client.close()
    assert [s.conn for s in engine.seen] == [0, 1]


async def test_an_idle_connection_is_closed_before_the_engine_would(engine: Engine, monkeypatch) -> None:
    monkeypatch.setattr(upstream, "IDLE_S", 0.2)
    client = EngineClient(engine.url, OndemandSettings())
    try:
        await call(client, engine, "1")
        await call(client, engine, "2")
        await asyncio.sleep(0.4)  # (the pool's 0.2 s timer on this same loop is due first: it has run)
        await call(client, engine, "3")
    finally:
        await client.close()
    assert [s.conn for s in engine.seen] == [0, 0, 1]


async def test_the_request_line_and_host_are_the_engines(client: EngineClient, engine: Engine) -> None:
    await call(client, engine, "1")
    seen = engine.seen[0].headers
    assert seen["host"] == engine.url.removeprefix("http://")
    assert seen["content-length"] == str(len(BODY))
    assert seen["x-seq"] == "1"


async def test_requests_beyond_the_pool_wait_for_a_connection(engine: Engine) -> None:
    """At most ``limit`` connections: the request past it waits for one to come free."""
    client = EngineClient(engine.url, OndemandSettings(), max_connections=1)
    try:
        first = await client.request("POST", "/v1/chat/completions", BODY, headers("1"))
        second = asyncio.create_task(call(client, engine, "2"))
        await asyncio.sleep(0.1)  # (a negative check: a slow machine cannot fail it)
        assert not second.done() and engine.seqs() == ["1"]  # waiting: the only connection is busy
        assert await first.read() == b'{"ok": true}'
        first.close()  # back to the pool: handed to the waiting request
        await second
    finally:
        await client.close()
    assert [s.conn for s in engine.seen] == [0, 0]


async def test_a_request_waits_no_longer_than_the_pool_timeout(engine: Engine) -> None:
    client = EngineClient(engine.url, OndemandSettings(upstream_pool_timeout_s=0.2), max_connections=1)
    try:
        first = await client.request("POST", "/v1/chat/completions", BODY, headers("1"))
        with pytest.raises(PoolTimeout):
            await call(client, engine, "2")
        first.close()
        await call(client, engine, "3")  # the pool works on
    finally:
        await client.close()
    assert engine.seqs() == ["1", "3"]
