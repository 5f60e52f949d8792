#!/usr/bin/env python3
"""CPU cost of dgxmm's HTTP protocol (dgxmm/front/protocol.py) against uvicorn's own, per request.

    .venv/bin/python bench/protocol.py [--requests N] [--rounds R]

No sockets, no engine: each protocol class gets a transport double that keeps what is written,
and one keep-alive connection sends the same small request (the head LiteLLM sends for a chat
completion, about 400 bytes and 12 fields) N times to an ASGI app that answers 200 with a short
body. The difference between the two rows is what the front door's limits cost per request:
parsing in pieces, the head deadline timer, the connection budget's bookkeeping. Rounds
alternate the two classes; the table shows the median of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits
from dgxmm.front.protocol import FrontConfig

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
REQUEST = (
    b"POST /dgxmm/ondemand/0a0d5fa46cf1/v1/chat/completions HTTP/1.1\r\nHost: dgxmm:8090\r\n"
    b"Accept: application/json\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
    b"User-Agent: AsyncOpenAI/Python 1.99.0\r\nX-Stainless-Lang: python\r\nX-Stainless-Os: Linux\r\n"
    b"X-Stainless-Runtime: CPython\r\nAuthorization: Bearer sk-ondemand-0123456789abcdef\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.2", 40000), "sockname": ("127.0.0.1", 8090)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None: ...


async def app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")],
        }
    )
    await send({"type": "http.response.body", "body": b"{}"})


def config(front: bool) -> Config:
    kwargs: dict[str, Any] = {"lifespan": "off", "log_level": "warning", "access_log": False}
    if front:
        limits = FrontLimits(header_timeout_s=10, max_connections=4096, admin_reserve=64)
        cfg: Config = FrontConfig(app, limits=limits, budget=ConnectionBudget(4096, limits.max_head_bytes), **kwargs)
    else:
        cfg = Config(app, http=HttpToolsProtocol, **kwargs)
    cfg.load()
    return cfg


async def one_round(cfg: Config, requests: int) -> float:
    """Seconds of CPU (process time) per request over one keep-alive connection."""
    state = ServerState()
    protocol = cfg.http_protocol_class(config=cfg, server_state=state, app_state={})  # type: ignore[call-arg]
    transport = Transport()
    protocol.connection_made(transport)
    start = time.process_time()
    for _ in range(requests):
        protocol.data_received(REQUEST)
        while state.tasks:
            await asyncio.sleep(0)
    spent = time.process_time() - start
    assert not transport.closed and transport.written > requests * 40, "the requests were not answered"
    protocol.connection_lost(None)
    return spent / requests


async def main(requests: int, rounds: int) -> None:
    configs = {"uvicorn HttpToolsProtocol": config(False), "dgxmm FrontDoorProtocol": config(True)}
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, cfg in configs.items():
            results[name].append(await one_round(cfg, requests))
    base = statistics.median(results["uvicorn HttpToolsProtocol"])
    print(f"{requests} requests per round, {rounds} rounds, CPU per request (median of rounds)\n")
    print("| protocol | us per request | vs uvicorn |")
    print("|---|---:|---:|")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1e6:.1f} | {median / base:.2f}x ({(median - base) * 1e6:+.1f} us) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main(args.requests, args.rounds))
    except ImportError:
        asyncio.run(main(args.requests, args.rounds))
