#!/usr/bin/env python3
"""``dgxmm serve`` with a task-free lane for a ready deployment's non-streaming requests: what
the floor of bench/floor_serve.py costs without the ASGI task and its coroutines
(bench/frontdoors.py ``--lane``). A benchmark's patch, not a dgxmm setting; like the floor it
skips the gateway's checks, slot, history and metrics, and also the mount and the peer guard.

    .venv/bin/python bench/lane_serve.py serve --config FILE

The protocol holds back the ASGI task of a POST under the gateway's prefix until the request's
body is in. Then, if the body does not ask for a stream, the deployment is ready and its pool
has an idle connection, the request is written to the engine from the parser's callback, and
the answer from the engine connection's (a done-callback on its head): no task, no coroutine.
Anything else starts the held-back task, and the request takes the usual way.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import dgxmm.ondemand.gateway as gateway
from dgxmm.cli import main
from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.models import State
from dgxmm.front.cycle import FrontCycle
from dgxmm.front.protocol import FrontDoorProtocol
from dgxmm.ondemand.engineconn import EngineResponse
from dgxmm.ondemand.forward import request_headers, response_headers
from dgxmm.telemetry.exchange import HEADER, request_id
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

GATEWAYS: list[gateway.Gateway] = []
_init = gateway.Gateway.__init__


def _record(self: gateway.Gateway, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    GATEWAYS.append(self)


class LaneProtocol(FrontDoorProtocol):
    held: tuple[Any, Any] | None = None

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if GATEWAYS and cycle.scope["method"] == "POST" and cycle.scope["path"].startswith(GATEWAYS[0].prefix + "/"):
            self.held = (cycle, app)
            return
        HttpToolsProtocol._start_asgi_task(self, cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        held, self.held = self.held, None
        if held is None:
            return
        cycle = held[0]
        body = cycle.whole_body()
        if body is None or not self._lane(cycle, body):
            if body is not None:  # put it back for the task's own whole_body()
                cycle.body = bytearray(body)
                cycle.message_event.set()
            HttpToolsProtocol._start_asgi_task(self, *held)

    def _lane(self, cycle: FrontCycle, body: bytes) -> bool:
        if b'"stream": true' in body:
            return False
        gw = GATEWAYS[0]
        scope = cycle.scope
        parts = scope["path"][len(gw.prefix) + 1:].split("/", 2)
        if len(parts) < 3 or parts[1] != "v1":
            return False
        dep = gw._deployer.peek(parts[0])
        if dep is None or dep.state is not State.READY or dep.base_url is None:
            return False
        clients = gw._forwarder.clients
        client = clients.begin(dep.id, dep.base_url, engine_of(dep).closes_after_streams, dep.upstream_max_connections)
        conn = client._pooled()
        if conn is None:
            clients.end(client)
            return False
        rid = request_id(scope)
        lines = [b"POST /v1/", parts[2].encode(), b" HTTP/1.1\r\n", client._host_line]
        for name, value in request_headers(scope, rid):
            lines += (name, b": ", value, b"\r\n")
        lines += (b"content-length: %d\r\n\r\n" % len(body), body)
        conn.carried_stream = False
        head = conn.send(b"".join(lines), head_only=False)
        ex_header = (HEADER, rid.encode())

        def answered(fut: asyncio.Future[EngineResponse]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                clients.end(client)
                cycle.respond(502, [(b"content-type", b"application/json")], b'{"error": {"message": "engine"}}')
                return
            resp = fut.result()
            if not resp.complete:  # not in this prototype's lane: finish it in a task
                asyncio.get_running_loop().create_task(rest(resp))
                return
            cycle.respond(resp.status, response_headers(resp.headers, ex_header), resp.take())
            resp.close()
            clients.end(client)

        async def rest(resp: EngineResponse) -> None:
            try:
                raw = await resp.read()
                cycle.respond(resp.status, response_headers(resp.headers, ex_header), raw)
            finally:
                resp.close()
                clients.end(client)

        head.add_done_callback(answered)
        return True


if __name__ == "__main__":
    gateway.Gateway.__init__ = _record  # type: ignore[method-assign]
    import dgxmm.front.protocol

    dgxmm.front.protocol.FrontDoorProtocol = LaneProtocol  # type: ignore[misc]
    main(sys.argv[1:])
