"""Where an engine's answer ends (dgxmm.engineclient.connection): at its length, at its last chunk, or,
with neither, at the connection's end. An answer cut short by a closed connection is never
passed on as if it were whole.

Against a raw engine on real sockets (tests/unit/rawengine.py) that sends part of an answer and
closes, or an answer delimited only by its close.
"""

from __future__ import annotations

import pytest
from conftest import wait_until
from unit.rawengine import JSON_BODY, STREAM_BODY, Engine, Plan

from dgxmm.engineclient.connection import EngineDisconnected
from dgxmm.engineclient.pool import EngineClient
from dgxmm.settings import OndemandSettings


async def answer(plan: Plan, kept: int) -> bytes | EngineDisconnected:
    """The body read from the engine (or the error its read raised), once the client holds
    ``kept`` connections (a closed one is let go when its transport reports the end)."""
    engine = Engine(plan=lambda seq: plan)
    client = EngineClient(engine.url, OndemandSettings())
    try:
        resp = await client.request("POST", "/v1/chat/completions", b"{}", b"", plan.stream)
        try:
            assert resp.status == 200
            body: bytes | EngineDisconnected = await resp.read()
        except EngineDisconnected as exc:
            body = exc
        finally:
            resp.close()
        await wait_until(lambda: client.open_connections == kept, 5)
        return body
    finally:
        await client.close()
        engine.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["with a length", "chunked"])
async def test_an_answer_cut_short_by_the_engine_fails_its_read(stream: bool) -> None:
    body = await answer(Plan(stream=stream, break_off=True), kept=0)
    assert isinstance(body, EngineDisconnected)


async def test_an_answer_that_runs_to_the_close_is_whole_at_the_close() -> None:
    body = await answer(Plan(until_close=True), kept=0)  # such a connection is never pooled
    assert body == JSON_BODY


@pytest.mark.parametrize("stream", [False, True], ids=["with a length", "chunked"])
async def test_a_whole_answer_is_read_whole_and_its_connection_kept(stream: bool) -> None:
    body = await answer(Plan(stream=stream), kept=1)
    assert body == (STREAM_BODY if stream else JSON_BODY)


@pytest.mark.parametrize(
    ("plan", "why"),
    [
        (Plan(extra_headers=2_000), "the engine's answer has more than 100 header fields"),
        (Plan(long_header=10 * 1024 * 1024), "the engine's answer head exceeds 65536 bytes"),
        (Plan(long_header=70_000), "the engine's answer head exceeds 65536 bytes"),  # (in as few as one read)
    ],
    ids=["2,000 header fields", "a 10 MiB header value", "a 70 kB header value"],
)
async def test_an_answer_head_past_the_limits_is_refused(plan: Plan, why: str) -> None:
    """An engine's answer head is held to the front door's limits (20,000 response headers used to
    take 46 MiB): the request fails with the reason, and the connection is not kept."""
    engine = Engine(plan=lambda seq: plan)
    client = EngineClient(engine.url, OndemandSettings())
    try:
        with pytest.raises(EngineDisconnected) as caught:
            await client.request("POST", "/v1/chat/completions", b"{}", b"")
        assert str(caught.value) == why
        await wait_until(lambda: client.open_connections == 0, 5)
    finally:
        await client.close()
        engine.stop()


async def test_a_head_within_the_limit_is_kept_whatever_comes_in_the_same_read() -> None:
    """The limit is the head's: a head near it, sent in one write with a large body, is one read
    of head and body together (the CI run that counted both refused a 300 kB answer)."""
    body = await answer(Plan(long_header=60_000, padding=1_000_000), kept=1)
    assert body == JSON_BODY + b" " * 1_000_000
