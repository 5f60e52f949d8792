"""No request lost to an engine's connection habits, none run twice (docs/gateway.md, "Connection
reuse").

Mixed streaming and non-streaming traffic, 8 at a time, goes through the gateway to a test engine
that closes its connections the way real engines do (tests/engines/testengine_conn.py). Every
request must be answered 200, whole, and reach the engine exactly once (its request log, by the
x-test-seq header). Each test also checks that the engine really closed connections as asked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from conftest import caller
from integration.test_gateway_checks import engine_requests, od_service
from mixed_traffic import SEQ_HEADER, drive, failures, seen_once

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def connection_counts(view: dict) -> dict:
    async with httpx.AsyncClient() as c:
        return dict((await c.get(view["base_url"] + "/_test/connections")).json())


async def check(view: dict, outcomes: list) -> None:
    assert failures(outcomes) == []
    seen = [r["headers"][SEQ_HEADER] for r in await engine_requests(view) if r["path"] == "/v1/chat/completions"]
    assert seen_once(outcomes, seen) == {}


async def test_an_engine_that_closes_after_every_stream(serve, tmp_path: Path) -> None:
    """As llama-server: the connection is closed right after a streamed answer, whose headers
    still offer keep-alive."""
    svc, view = await od_service(serve, tmp_path, "--close-after-stream", state="ready")
    async with caller(svc, timeout=60) as g:
        outcomes = await drive(g, f"/{view['id']}/v1/chat/completions", 400, 8, BODY)
    await check(view, outcomes)
    assert (await connection_counts(view))["closed_after_stream"] == 200


async def test_an_engine_that_closes_idle_connections_after_4_s(serve, tmp_path: Path) -> None:
    """As uvicorn (vLLM) after its keep-alive timeout: a connection idle for 4 s is closed,
    unannounced. The traffic pauses for just under that, so the next burst would meet
    connections the engine is closing at that very moment: the gateway must no longer offer
    them (it closes its own after 3 s idle; which side closes first is a matter of timing)."""
    svc, view = await od_service(serve, tmp_path, "--idle-close", "4", state="ready")
    outcomes = []
    async with caller(svc, timeout=60) as g:
        for burst in range(4):
            outcomes += await drive(g, f"/{view['id']}/v1/chat/completions", 48, 8, BODY, first=burst * 48)
            if burst < 3:
                await asyncio.sleep(3.95)  # (any pause is a valid case: the check holds whichever side closes first)
    await check(view, outcomes)


async def test_an_engine_that_closes_idle_connections_sooner(serve, tmp_path: Path) -> None:
    """An engine closing connections idle for 1 s, before the gateway's own 3 s: between bursts
    it closes every pooled connection, which the gateway must then not write to."""
    svc, view = await od_service(serve, tmp_path, "--idle-close", "1", state="ready")
    outcomes = []
    async with caller(svc, timeout=60) as g:
        for burst in range(3):
            outcomes += await drive(g, f"/{view['id']}/v1/chat/completions", 48, 8, BODY, first=burst * 48)
            if burst < 2:
                await asyncio.sleep(1.5)  # past the 1 s idle close (a slow machine only waits longer)
    await check(view, outcomes)
    assert (await connection_counts(view))["idle_closed"] > 0


async def test_an_engine_that_caps_requests_per_connection(serve, tmp_path: Path) -> None:
    """As cpp-httplib at its keep-alive max count: the last answer says Connection: close."""
    svc, view = await od_service(serve, tmp_path, "--max-requests-per-conn", "3", state="ready")
    async with caller(svc, timeout=60) as g:
        outcomes = await drive(g, f"/{view['id']}/v1/chat/completions", 300, 8, BODY)
    await check(view, outcomes)
    assert (await connection_counts(view))["capped"] >= 20  # fewer while parked after streams (engineclient/pool.py)
