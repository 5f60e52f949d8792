#!/usr/bin/env python3
"""Instructions per gateway request, counted by valgrind's callgrind: two versions side by side.

    .venv/bin/python bench/instructions.py --baseline-src DIR [--requests N] [--concurrency C] [--keep DIR]

The shared 2-core machines these benchmarks run on make CPU time per request move by tens of
microseconds between runs, more than most single changes to the hot path save. An instruction
count does not move with the machine's load: the same code, inputs and environment execute the
same instructions (within a fraction of a percent: timers, hash seeds). So this counts the
instructions dgxmm's process executes per gateway request, for this checkout's ``src`` and for
``--baseline-src`` (another checkout's ``src``, e.g. main's), each run once with the same
requests, and prints both, their difference and ratio.

What it counts: everything dgxmm's own process executes between the counter's start and stop
(``callgrind_control -i on/off``) while N requests (non-streaming, then streaming) go through
the gateway to the test engine, divided by N: the front door, the gateway, the engine client,
uvloop and the interpreter. Not counted: the kernel's side of the system calls, the engine and
the load generator (other processes). Instructions are not time (a cache miss costs more than
an add), so this measures the Python work a change removes, not the whole of CPU time; the
gateway benchmark (bench/gateway.py) still says what a request costs.

Under valgrind dgxmm runs about 50 times slower: start-up takes a minute or two, and the counted
requests go at c=4 (the gateway's path is the same at any concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from scenario import CALLER, KEY, ROOT, chat_body
from servers import Children, Setup, log, start_dgxmm, tail

TOTALS = re.compile(r"^totals:\s+(\d+)", re.MULTILINE)


async def drive(url: str, count: int, concurrency: int, stream: bool) -> None:
    """``count`` requests at ``concurrency``, each answered 200 and read to its end."""
    body = json.dumps(chat_body(stream)).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    transport = httpx.AsyncHTTPTransport(local_address=CALLER)
    left = [count]
    async with httpx.AsyncClient(transport=transport, timeout=600, headers=headers) as client:

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                resp = await client.post(url, content=body)
                await resp.aread()
                if resp.status_code != 200:
                    raise RuntimeError(f"gateway answered {resp.status_code}: {resp.text[:300]}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def count(
    src: Path, tmp: Path, children: Children, requests: int, concurrency: int, keep: Path | None
) -> dict[str, float]:
    """Start dgxmm from ``src`` under callgrind (bench/servers.py's dgxmm, the same deployment),
    warm it up, count ``requests`` of each kind."""
    tmp.mkdir()
    out = tmp / "callgrind.out"
    launcher = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "dgxmm.cli",
        "serve",
    ]
    log(f"starting dgxmm from {src} under callgrind (a minute or two)")
    proc, url, _, _ = start_dgxmm(
        Setup(tmp, children), "dgxmm", launcher, {**os.environ, "PYTHONPATH": str(src)}, start_timeout=600
    )
    figures: dict[str, float] = {}
    for stream in (False, True):
        kind = "stream" if stream else "plain"
        asyncio.run(drive(url, max(50, requests // 5), concurrency, stream))  # warm-up (and the cold start)
        time.sleep(1.5)  # past the engine pool's settling of streamed connections
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        asyncio.run(drive(url, requests, concurrency, stream))
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        before = set(tmp.glob("callgrind.out*"))
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        dumps = sorted(set(tmp.glob("callgrind.out*")) - before, key=lambda p: p.stat().st_mtime)
        if not dumps:
            raise RuntimeError(f"callgrind wrote no dump for {src}\n{tail(tmp / 'dgxmm' / 'dgxmm.log')}")
        found = TOTALS.search(dumps[-1].read_text(errors="replace"))
        if found is None:
            raise RuntimeError(f"no totals in {dumps[-1]}")
        figures[kind] = int(found[1]) / requests
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(dumps[-1], keep / f"callgrind.{tmp.name}.{kind}")
        log(f"{src}: {figures[kind]:,.0f} instructions per {kind} request")
    children.stop_all()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", type=Path, required=True, help="the other checkout's src directory")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="copy the callgrind dumps here (for callgrind_annotate)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    this = ROOT / "src"
    children = Children()
    with tempfile.TemporaryDirectory(prefix="dgxmm-instr-") as tmp:
        try:
            results = {
                "baseline": count(
                    args.baseline_src.resolve(),
                    Path(tmp) / "baseline",
                    children,
                    args.requests,
                    args.concurrency,
                    args.keep,
                ),
                "this": count(this, Path(tmp) / "this", children, args.requests, args.concurrency, args.keep),
            }
        finally:
            children.stop_all()
    print(
        f"\nInstructions per gateway request in dgxmm's process (callgrind, {args.requests} requests "
        f"at c={args.concurrency}; baseline {args.baseline_src}):\n"
    )
    print("| request | baseline | this checkout | difference | ratio |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("plain", "stream"):
        old, new = results["baseline"][kind], results["this"][kind]
        print(f"| {kind} | {old:,.0f} | {new:,.0f} | {new - old:+,.0f} | {new / old:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
