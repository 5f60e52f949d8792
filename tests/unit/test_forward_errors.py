"""The gateway's 502 names the deployment and the kind of failure, never the engine's address; an
engine that breaks off its answer is a 502 while nothing was passed on, else a cut connection."""

from __future__ import annotations

import json
import logging
import socket
import weakref
from typing import Any

from dgxmm.deploy.models import Deployment, RuntimeHandle, State
from dgxmm.front.cycle import FRONT
from dgxmm.ondemand.forward import Forwarder
from dgxmm.ondemand.upstream import UpstreamClients
from dgxmm.settings import OndemandSettings
from dgxmm.telemetry.exchange import Exchange
from unit.rawengine import Engine, Plan


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


async def test_unreachable_engine_502_does_not_show_its_address() -> None:
    port = closed_port()
    dep = Deployment(id="d1", name="tiny", served_name="tiny", engine="command", memory_gib=1, state=State.READY,
                     runtime_handle=RuntimeHandle(ref="1", base_url=f"http://127.0.0.1:{port}", port=port))  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    clients = UpstreamClients(OndemandSettings())
    scope = {"type": "http", "method": "POST", "headers": [], "query_string": b""}
    try:
        ex = Exchange(0.0, "r-1", "127.0.0.2")
        await Forwarder(clients).forward(scope, send, dep, "chat/completions", b"{}", ex)
    finally:
        await clients.close()
    assert sent[0]["status"] == 502 and (b"x-request-id", b"r-1") in sent[0]["headers"]
    assert (ex.status, ex.code) == (502, "ondemand_upstream_error")
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "ondemand_upstream_error"
    assert error["message"].startswith("engine unreachable: tiny (")
    assert "127.0.0.1" not in error["message"] and str(port) not in error["message"]


class Front:
    """The front door's cycle as the forwarder uses it when an engine breaks off."""

    def __init__(self) -> None:
        self.response_started = False
        self.cuts = 0

    def cut(self) -> None:
        self.cuts += 1


async def broken_off(caplog: Any, *, stream: bool, **forward: Any) -> tuple[list[dict[str, Any]], Exchange, Front]:
    """One request to a raw engine that sends its answer's head and part of its body, then
    closes; what the caller was sent, the exchange and the front door's cycle."""
    engine = Engine(plan=lambda seq: Plan(stream=stream, break_off=True))
    dep = Deployment(id="d1", name="tiny", served_name="tiny", engine="command", memory_gib=1, state=State.READY,
                     runtime_handle=RuntimeHandle(ref="1", base_url=engine.url, port=engine.port))  # fmt: skip
    front = Front()
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            front.response_started = True
        sent.append(message)

    clients = UpstreamClients(OndemandSettings())
    scope = {"type": "http", "method": "POST", "headers": [], "query_string": b"", "extensions": {FRONT: weakref.ref(front)}}
    ex = Exchange(0.0, "r-1", "127.0.0.2")
    caplog.set_level(logging.WARNING, logger="dgxmm.ondemand.forward")
    try:
        await Forwarder(clients).forward(scope, send, dep, "chat/completions", b"{}", ex, streaming=stream, **forward)
    finally:
        await clients.close()
        engine.stop()
    return sent, ex, front


async def test_an_answer_broken_off_under_way_is_cut_with_one_warning(caplog: Any) -> None:
    sent, ex, front = await broken_off(caplog, stream=True)
    assert sent[0]["status"] == 200 and front.cuts == 1  # the caller's connection is cut: no last chunk
    assert not any(m["type"] == "http.response.body" and not m.get("more_body") for m in sent)
    assert ex.code == "ondemand_upstream_error"
    [record] = caplog.records
    assert "the engine broke off its answer: tiny" in record.getMessage() and record.request_id == "r-1"


async def test_an_answer_broken_off_before_any_of_it_was_passed_on_is_a_502(caplog: Any) -> None:
    """A non-streaming answer behind a queued notice is read whole before it is passed on."""
    sent, ex, front = await broken_off(caplog, stream=False, prepend_notice=True)
    assert front.cuts == 0 and sent[0]["status"] == 502 and (ex.status, ex.code) == (502, "ondemand_upstream_error")
    error = json.loads(sent[1]["body"])["error"]
    assert error["message"] == "the engine broke off its answer: tiny" and "127.0.0.1" not in sent[1]["body"].decode()


async def test_an_answer_broken_off_after_a_queued_notice_ends_the_stream_with_an_error(caplog: Any) -> None:
    sent, ex, front = await broken_off(caplog, stream=True, sse_started=True)
    assert front.cuts == 0 and ex.code == "ondemand_upstream_error"
    last = sent[-1]
    assert last["type"] == "http.response.body" and not last.get("more_body")
    assert b"the engine broke off its answer: tiny" in last["body"] and last["body"].endswith(b"data: [DONE]\n\n")
