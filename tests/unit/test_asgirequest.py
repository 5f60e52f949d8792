"""A gateway request that came through ASGI (dgxmm.gateway.asgirequest.AsgiRequest): the same
shape as the front door's own, on ASGI messages. The body is read with its limit, a hang-up after
the body runs ``hangup`` (the spec's "each request watches for the client's disconnect"), and an
answer is the messages an ASGI server expects, with the framing the adapter sets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dgxmm.gateway.asgirequest import AsgiRequest

SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/dgxmm/ondemand/d/v1/chat/completions",
    "raw_path": b"/dgxmm/ondemand/d/v1/chat/completions",
    "query_string": b"a=1",
    "headers": [(b"content-type", b"application/json")],
    "client": ("127.0.0.2", 4000),
}


class Peer:
    """The server's side: body messages to hand out, then a disconnect when ``gone`` is set."""

    def __init__(self, *bodies: bytes) -> None:
        self.bodies = list(bodies)
        self.gone = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.bodies:
            body = self.bodies.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.bodies)}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def test_the_head_and_body_are_read_from_the_scope_and_receive() -> None:
    peer = Peer(b'{"a":', b" 1}")
    req = AsgiRequest(SCOPE, peer.receive, peer.send)
    assert (req.method, req.raw_path, req.query, req.client) == ("POST", SCOPE["raw_path"], b"a=1", ("127.0.0.2", 4000))
    assert await req.body(100) == b'{"a": 1}'
    req.close()
    assert await AsgiRequest(SCOPE, Peer(b"x" * 101).receive, peer.send).body(100) is None


async def test_a_hang_up_after_the_body_runs_hangup_once() -> None:
    peer = Peer(b"{}")
    req = AsgiRequest(SCOPE, peer.receive, peer.send)
    calls: list[str] = []
    req.hangup = lambda: calls.append("hangup")
    await req.body(100)
    peer.gone.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert calls == ["hangup"] and req.disconnected and req.hangup is None


async def test_a_request_that_ends_stops_watching() -> None:
    peer = Peer(b"{}")
    req = AsgiRequest(SCOPE, peer.receive, peer.send)
    calls: list[str] = []
    req.hangup = lambda: calls.append("hangup")
    await req.body(100)
    await req.respond(200, [(b"content-type", b"application/json"), (b"content-length", b"99")], b"{}")
    peer.gone.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert calls == [] and not req.disconnected
    assert peer.sent == [
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")],
        },
        {"type": "http.response.body", "body": b"{}"},
    ]


async def test_a_relayed_answer_and_a_cut_one() -> None:
    peer = Peer(b"{}")
    req = AsgiRequest(SCOPE, peer.receive, peer.send)
    await req.body(100)
    await req.start(200, [(b"transfer-encoding", b"chunked"), (b"x-a", b"1")])
    await req.write(b"data: 1\n\n")
    await req.write(b"")  # nothing for an empty piece
    with pytest.raises(ConnectionAbortedError):
        req.cut()  # under ASGI the server ends an answer the application gives up on
    assert peer.sent == [
        {"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]},
        {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
    ]
    with pytest.raises(RuntimeError):
        await req.start(200, [])
