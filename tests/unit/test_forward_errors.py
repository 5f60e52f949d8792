"""The gateway's 502 names the deployment and the kind of failure, never the engine's address; an
engine that breaks off its answer is a 502 while nothing was passed on; under way, an event stream
broken off between events ends with the error event and [DONE], anything else is cut."""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

from dgxmm.records.deployment import Deployment, RuntimeHandle, State
from dgxmm.gateway.forward import Forwarder
from dgxmm.gateway.heads import Heads
from dgxmm.engineclient.pool import UpstreamClients
from dgxmm.settings import OndemandSettings
from dgxmm.gateway.exchange import Exchange
from unit.rawengine import Engine, Plan
from unit.recorded import Recorded


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


async def test_unreachable_engine_502_does_not_show_its_address() -> None:
    port = closed_port()
    dep = Deployment(
        id="d1",
        name="tiny",
        served_name="tiny",
        engine="command",
        memory_gib=1,
        state=State.READY,
        runtime_handle=RuntimeHandle(ref="1", base_url=f"http://127.0.0.1:{port}", port=port),
    )
    req = Recorded()
    clients = UpstreamClients(OndemandSettings())
    try:
        ex = Exchange(0.0, "r-1", "127.0.0.2")
        await Forwarder(clients).forward(req, Heads([]), dep, "chat/completions", b"{}", ex)
    finally:
        await clients.close()
    assert req.status == 502 and (b"x-request-id", b"r-1") in req.answer_headers and req.ended
    assert (ex.status, ex.code) == (502, "ondemand_upstream_error")
    error = json.loads(req.body_bytes)["error"]
    assert error["code"] == "ondemand_upstream_error"
    assert error["message"].startswith("engine unreachable: tiny (")
    assert "127.0.0.1" not in error["message"] and str(port) not in error["message"]


async def broken_off(
    caplog: Any, *, stream: bool, events: int | None = None, partial: int = 0, **forward: Any
) -> tuple[Recorded, Exchange]:
    """One request to a raw engine that sends its answer's head and part of its body, then
    closes; what the caller was sent, and the exchange."""
    engine = Engine(plan=lambda seq: Plan(stream=stream, break_off=True, events=events, partial=partial))
    dep = Deployment(
        id="d1",
        name="tiny",
        served_name="tiny",
        engine="command",
        memory_gib=1,
        state=State.READY,
        runtime_handle=RuntimeHandle(ref="1", base_url=engine.url, port=engine.port),
    )
    req = Recorded()
    if forward.get("sse_started"):
        await req.start(200, [])  # the queued notice's head went out already
    clients = UpstreamClients(OndemandSettings())
    ex = Exchange(0.0, "r-1", "127.0.0.2")
    caplog.set_level(logging.WARNING, logger="dgxmm.gateway.forward")
    try:
        await Forwarder(clients).forward(
            req, Heads([]), dep, "chat/completions", b"{}", ex, streaming=stream, **forward
        )
    finally:
        await clients.close()
        engine.stop()
    return req, ex


async def test_an_answer_broken_off_under_way_is_cut_with_one_warning(caplog: Any) -> None:
    """After its [DONE] (all but the last chunk sent), the caller has the whole stream: cut."""
    req, ex = await broken_off(caplog, stream=True)
    assert req.status == 200 and req.cuts == 1 and not req.ended  # the caller's connection is cut: no last chunk
    assert ex.code == "ondemand_upstream_error"
    [record] = caplog.records
    assert "the engine broke off its answer: tiny" in record.getMessage() and record.request_id == "r-1"


async def test_an_event_stream_broken_off_between_events_ends_with_the_error_event(caplog: Any) -> None:
    """An engine that dies (or is ended as hung) between two events: the caller's stream gets
    the gateway's error event and [DONE], a whole answer its SSE client raises as an error."""
    req, ex = await broken_off(caplog, stream=True, events=2)
    assert req.status == 200 and req.cuts == 0 and req.ended
    assert ex.code == "ondemand_upstream_error"
    body = b"".join(req.chunks)
    assert body.startswith(b'data: {"n": 1}\n\ndata: {"n": 1}\n\ndata: {"error": ')
    error = json.loads(body.split(b"\n\n")[2].removeprefix(b"data: "))["error"]
    assert error["code"] == "ondemand_upstream_error" and error["message"] == "the engine broke off its answer: tiny"
    assert body.endswith(b"\n\ndata: [DONE]\n\n")
    [record] = caplog.records
    assert "the engine broke off its answer: tiny" in record.getMessage()


async def test_an_event_stream_broken_off_inside_an_event_is_cut(caplog: Any) -> None:
    """Half an event went out: an error event after it would not read as one. Cut."""
    req, ex = await broken_off(caplog, stream=True, events=1, partial=7)
    assert req.status == 200 and req.cuts == 1 and not req.ended
    assert ex.code == "ondemand_upstream_error"


async def test_an_answer_broken_off_before_any_of_it_was_passed_on_is_a_502(caplog: Any) -> None:
    """A non-streaming answer behind a queued notice is read whole before it is passed on."""
    req, ex = await broken_off(caplog, stream=False, prepend_notice=True)
    assert req.cuts == 0 and req.status == 502 and (ex.status, ex.code) == (502, "ondemand_upstream_error")
    error = json.loads(req.body_bytes)["error"]
    assert error["message"] == "the engine broke off its answer: tiny" and b"127.0.0.1" not in req.body_bytes


async def test_an_answer_broken_off_after_a_queued_notice_ends_the_stream_with_an_error(caplog: Any) -> None:
    req, ex = await broken_off(caplog, stream=True, sse_started=True)
    assert req.cuts == 0 and ex.code == "ondemand_upstream_error" and req.ended
    assert b"the engine broke off its answer: tiny" in req.chunks[-1] and req.chunks[-1].endswith(b"data: [DONE]\n\n")
