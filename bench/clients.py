#!/usr/bin/env python3
"""The gateway's engine client against the library clients it could be, by CPU per request.

    .venv/bin/python bench/clients.py [--quick] [--rounds N] [--requests N] [--json FILE]

One test engine (tests/engines/testengine.py, its own process, ``--max-num-seqs 4096``) and, in
this process on uvloop, each client sending the gateway's kind of request to it: a LiteLLM-sized
chat completion with the headers the gateway forwards, 16 at a time over kept-alive connections
(a pool of 256, as the gateway's). Measured: this process's CPU time (user + system) per request,
for non-streaming answers read whole, and per streamed answer (51 SSE events) read chunk by chunk
as the gateway relays them. The engine's CPU is not counted: only the client's is.

Clients, each set up as well as it goes for this job:

* **dgxmm** ``engineclient.connection`` (httptools on asyncio protocols, through ``engineclient.pool.EngineClient``
  as the gateway uses it, with its stale-connection check before every write);
* **aiohttp** ``ClientSession``, defaults (as the gateway used it before);
* **aiohttp, tuned**: no cookie jar, no automatic decompression, no auto headers, no per-host
  limit, the body as bytes, ``readany`` reads;
* **httpx** ``AsyncClient`` (HTTP/1.1, the pool limits above);
* **httpcore** ``AsyncConnectionPool`` (httpx's transport without httpx's models).

Rounds alternate the clients in rotated order; the figure is the median of the rounds, and the
ratio is to dgxmm's client in the same rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpcore
import httpx
import uvloop
from scenario import ROOT, SERVED, chat_body
from servers import Children, free_port, log, wait_for

from dgxmm.engineclient.pool import EngineClient
from dgxmm.settings import OndemandSettings

CONCURRENCY = 16
POOL = 256
HEADERS = [
    (b"content-type", b"application/json"),
    (b"user-agent", b"litellm/1.80.0"),
    (b"accept", b"*/*"),
    (b"x-request-id", b"0123456789abcdef"),
    (b"accept-encoding", b"identity"),
]

LINES = b"".join(b"%b: %b\r\n" % pair for pair in HEADERS)  # dgxmm's client takes the header lines whole
Send = Callable[[bool], Awaitable[int]]  # one request (streaming?) -> body bytes read


async def dgxmm_client(base: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    client = EngineClient(base, OndemandSettings(upstream_max_connections=POOL))

    async def send(stream: bool) -> int:
        resp = await client.request("POST", "/v1/chat/completions", BODIES[stream], LINES, stream)
        try:
            if resp.complete:
                return len(resp.take())
            n = 0
            while chunk := await resp.read_chunk():
                n += len(chunk)
            return n
        finally:
            resp.close()

    return send, client.close


async def aiohttp_client(base: str, tuned: bool) -> tuple[Send, Callable[[], Awaitable[None]]]:
    if tuned:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=POOL, limit_per_host=0, ttl_dns_cache=None),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None, connect=10),
        )
    else:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=POOL), timeout=aiohttp.ClientTimeout(total=None, connect=10)
        )
    headers = [(k.decode(), v.decode()) for k, v in HEADERS]
    url = base + "/v1/chat/completions"

    async def send(stream: bool) -> int:
        async with session.request("POST", url, data=BODIES[stream], headers=headers) as resp:
            n = 0
            while chunk := await resp.content.readany():
                n += len(chunk)
            return n

    return send, session.close


async def httpx_client(base: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(
        base_url=base,
        limits=httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL),
        timeout=httpx.Timeout(None, connect=10),
    )
    headers = [(k.decode(), v.decode()) for k, v in HEADERS]

    async def send(stream: bool) -> int:
        async with client.stream("POST", "/v1/chat/completions", content=BODIES[stream], headers=headers) as resp:
            n = 0
            async for chunk in resp.aiter_raw():
                n += len(chunk)
            return n

    return send, client.aclose


async def httpcore_client(base: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    pool = httpcore.AsyncConnectionPool(max_connections=POOL, max_keepalive_connections=POOL)
    url = base + "/v1/chat/completions"

    async def send(stream: bool) -> int:
        body = BODIES[stream]
        headers = [*HEADERS, (b"content-length", b"%d" % len(body))]
        async with pool.stream("POST", url, headers=headers, content=body) as resp:
            n = 0
            async for chunk in resp.aiter_stream():
                n += len(chunk)
            return n

    return send, pool.aclose


CLIENTS: dict[str, Callable[[str], Awaitable[tuple[Send, Callable[[], Awaitable[None]]]]]] = {
    "dgxmm engineconn": dgxmm_client,
    "aiohttp, defaults": lambda base: aiohttp_client(base, tuned=False),
    "aiohttp, tuned": lambda base: aiohttp_client(base, tuned=True),
    "httpx": httpx_client,
    "httpcore": httpcore_client,
}
BODIES = {stream: json.dumps(chat_body(stream)).encode() for stream in (False, True)}


async def one_round(send: Send, stream: bool, requests: int) -> float:
    """CPU microseconds of this process per request, ``requests`` sent 16 at a time."""
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            if await send(stream) <= 0:
                raise RuntimeError("empty answer")

    began = time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return 1e6 * (time.process_time() - began) / requests


async def measure(base: str, rounds: int, requests: int) -> dict[str, dict[bool, list[float]]]:
    made = {name: await make(base) for name, make in CLIENTS.items()}
    results: dict[str, dict[bool, list[float]]] = {name: {False: [], True: []} for name in CLIENTS}
    try:
        for send, _ in made.values():  # warm up: connections open, code paths hot
            for stream in (False, True):
                await one_round(send, stream, 200)
        names = list(CLIENTS)
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for stream in (False, True):
                for name in order:
                    results[name][stream].append(
                        await one_round(made[name][0], stream, requests // (8 if stream else 1))
                    )
            log(f"round {r + 1}/{rounds} done")
    finally:
        for _, close in made.values():
            await close()
    return results


def table(results: dict[str, dict[bool, list[float]]]) -> str:
    ours = {stream: results["dgxmm engineconn"][stream] for stream in (False, True)}
    out = [
        "| client | CPU us per non-streaming request | x dgxmm's | CPU us per streamed answer (51 events) | x dgxmm's |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, by in results.items():
        cells = []
        for stream in (False, True):
            ratio = statistics.median(a / b for a, b in zip(by[stream], ours[stream], strict=True))
            cells += [f"{statistics.median(by[stream]):.0f}", f"{ratio:.2f}x"]
        out.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2,000 requests")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--requests", type=int, help="non-streaming requests per round (streams: an eighth)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    requests = args.requests or (2000 if args.quick else 8000)
    children = Children()
    tmp = Path(tempfile.mkdtemp(prefix="dgxmm-clients-"))
    port = free_port()
    try:
        engine = children.spawn(
            "engine",
            [
                sys.executable,
                str(ROOT / "tests/engines/testengine.py"),
                "--port",
                str(port),
                "--served-name",
                SERVED,
                "--max-num-seqs",
                "4096",
            ],
            tmp / "engine.log",
        )
        base = f"http://127.0.0.1:{port}"
        wait_for("engine", lambda: httpx.get(base + "/health").status_code == 200, 30, engine)
        results = uvloop.run(measure(base, rounds, requests))
    finally:
        children.stop_all()
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"\n# engine clients, {time.strftime('%Y-%m-%d %H:%M %Z')}: {rounds} rounds of {requests} requests and"
        f" {requests // 8} streams, c={CONCURRENCY}; load average {' '.join(load)}\n"
    )
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({k: {str(s): v for s, v in by.items()} for k, by in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
