#!/usr/bin/env python3
"""``dgxmm serve`` with the gateway's own work cut out of a ready deployment's requests: the
floor of the current stack, to tell what the gateway's checks and bookkeeping cost from what the
front door, the ASGI task, the forwarding and the engine client cost (bench/frontdoors.py
``--floor``). A benchmark's patch, not a dgxmm setting: no key, path, header or body checks, no
rate limiter, no slot, no history, no metrics or access line; the peer guard and the mount's
share check still run.

    .venv/bin/python bench/floor_serve.py --config FILE

A request for a deployment that is not ready (the first one, which starts the engine) takes the
gateway's normal path.
"""

from __future__ import annotations

import sys
import time

import dgxmm.gateway.gateway as gateway
from dgxmm.cli import main
from dgxmm.records.deployment import State
from dgxmm.gateway.heads import Heads
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.exchange import Exchange, request_id_of

_full = gateway.Gateway.serve


async def _lean(self: gateway.Gateway, req: GatewayRequest, heads: Heads) -> None:
    parts = req.path[len(self.prefix) + 1 :].split("/", 2)
    dep = self._deployer.peek(parts[0])
    if dep is None or dep.state is not State.READY or len(parts) < 3 or parts[1] != "v1":
        await _full(self, req, heads)
        return
    body = await req.body(self.settings.max_body_bytes)
    assert body is not None
    ex = Exchange(time.monotonic(), request_id_of(heads.request_id()), "")
    await self._forwarder.forward(req, heads, dep, parts[2], body, ex, streaming=b'"stream": true' in body)


if __name__ == "__main__":
    gateway.Gateway.serve = _lean  # type: ignore[method-assign]
    main(sys.argv[1:])
