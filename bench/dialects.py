"""What a request costs dgxmm in each dialect (issue 49): the time to the first line of a streamed
chat at c=1, straight to the engine, through the router's ``/v1/chat/completions`` by name, and
through Ollama's ``/api/chat`` (translated to the engine's OpenAI API and back as NDJSON), in
interleaved rounds against one dgxmm and one test engine, with the engine's own record of what
each dialect asked of it.

    .venv/bin/python bench/dialects.py [--requests N] [--rounds R] [--check]

``--check`` fails (exit 1) when Ollama's added time to the first line (its p50 less the direct
p50) is more than 1 ms over the router's, or when the engine saw anything but one chat request per
request in either dialect with the same messages. Figures in docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from report import median, pct
from scenario import CALLER, KEY, SERVED
from servers import Children, Setup, log, start_dgxmm

MARGIN_MS = 1.0  # the bound on Ollama's added time over the router's
MESSAGES = [{"role": "user", "content": "Say something."}]


def targets(setup: Setup, gateway_url: str) -> dict[str, tuple[str, dict[str, Any], Callable[[bytes], bool]]]:
    """Each dialect's URL, body, and how to tell its first line of answer."""
    root = gateway_url.split("/dgxmm/")[0]
    sse = lambda line: line.startswith(b"data: {")  # noqa: E731
    return {
        "direct": (f"{setup.engine}/v1/chat/completions", {"model": SERVED, "messages": MESSAGES, "stream": True}, sse),
        "v1": (f"{root}/v1/chat/completions", {"model": SERVED, "messages": MESSAGES, "stream": True}, sse),
        "ollama": (f"{root}/api/chat", {"model": SERVED, "messages": MESSAGES}, lambda line: line.startswith(b"{")),
    }


async def first_lines(
    url: str, body: dict[str, Any], first: Callable[[bytes], bool], count: int, direct: bool
) -> list[float]:
    """``count`` streamed requests one after another on one connection: each one's time to its
    first line of answer; every stream is read to its end."""
    connector = aiohttp.TCPConnector(limit=1, local_addr=None if direct else (CALLER, 0))
    headers = {} if direct else {"Authorization": f"Bearer {KEY}"}
    data = json.dumps(body).encode()
    times = []
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        for _ in range(count):
            began = time.perf_counter()
            async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"{url}: {resp.status} {await resp.text()}")
                seen = None
                async for line in resp.content:
                    if seen is None and first(line):
                        seen = time.perf_counter() - began
                if seen is None:
                    raise RuntimeError(f"{url}: no line of answer")
                times.append(seen)
    return times


def engine_requests(setup: Setup) -> list[dict[str, Any]]:
    import httpx

    seen = httpx.get(f"{setup.engine}/_test/requests", timeout=30).json()
    httpx.delete(f"{setup.engine}/_test/requests", timeout=30)
    return list(seen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=300, help="requests per dialect per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dgxmm-bench-dialects-") as tmp:
        setup = Setup(Path(tmp), Children())
        try:
            _, gateway_url, setup.engine, setup.engine_pid = start_dgxmm(setup, "dgxmm")
            chosen = targets(setup, gateway_url)
            samples: dict[str, list[float]] = {name: [] for name in chosen}
            engine_saw: dict[str, list[dict[str, Any]]] = {}
            engine_requests(setup)  # (the warm-up's)
            for r in range(args.rounds):
                names = list(chosen)
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    url, body, first = chosen[name]
                    samples[name] += asyncio.run(first_lines(url, body, first, args.requests, name == "direct"))
                    engine_saw.setdefault(name, []).extend(engine_requests(setup))
                    log(f"round {r + 1}/{args.rounds} {name}: p50 {pct(samples[name], 50) * 1e3:.2f} ms")
        finally:
            setup.children.stop_all()
    return report(samples, engine_saw, args.requests * args.rounds, args.check)


def report(samples: dict[str, list[float]], engine_saw: dict[str, list[dict[str, Any]]], n: int, check: bool) -> int:
    direct = median(samples["direct"]) * 1e3
    print("| dialect | first line p50 (ms) | p99 (ms) | added over direct, p50 (ms) | engine requests |")
    print("|---|---|---|---|---|")
    for name, values in samples.items():
        p50, p99 = median(values) * 1e3, pct(values, 99) * 1e3
        added = "" if name == "direct" else f"{p50 - direct:+.3f}"
        print(f"| {name} | {p50:.3f} | {p99:.3f} | {added} | {len(engine_saw[name])} |")
    problems = []
    for name in ("v1", "ollama"):
        saw = engine_saw[name]
        paths = {r["path"] for r in saw}
        messages = {json.dumps(json.loads(r["body"])["messages"]) for r in saw}
        if len(saw) != n or paths != {"/v1/chat/completions"} or messages != {json.dumps(MESSAGES)}:
            problems.append(f"{name}: the engine saw {len(saw)} requests to {paths} with {len(messages)} message lists")
    extra = (median(samples["ollama"]) - median(samples["v1"])) * 1e3
    print(f"\nOllama's /api/chat over the router's /v1: {extra:+.3f} ms at p50 (bound: {MARGIN_MS:g} ms)")
    if extra > MARGIN_MS:
        problems.append(f"/api/chat adds {extra:.3f} ms over /v1 at p50, more than {MARGIN_MS:g} ms")
    for problem in problems:
        print(f"FAIL {problem}")
    return 1 if check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
