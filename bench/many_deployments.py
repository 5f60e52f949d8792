#!/usr/bin/env python3
"""What 1,000 deployments cost the readers that look at all of them: two versions side by side.

    .venv/bin/python bench/many_deployments.py [--count N] [--rounds R] [--baseline-src DIR]

Serves dgxmm in this process (as the integration tests do) with ``--count`` stopped on-demand
deployments, then times, best of ``--rounds``: ``GET /api/deployments`` over a real socket (every
view), the live status's full check (``LiveStatus.check`` after every deployment was announced,
what a change of capacity makes it do) and one ``statuses`` of all of them (the first message of
the event stream). With ``--baseline-src`` (another checkout's ``src``) it measures that code and
this checkout's in child processes taken in turns (``--turns`` each), the best figure of each
kept, so both sets come from one run on one machine under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def best(fn: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


async def measure(count: int, rounds: int) -> dict[str, float]:
    from dgxmm.app import create_app
    from dgxmm.front.server import build_server, listen
    from dgxmm.records.deployment import Deployment, Mode
    from dgxmm.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            server={"port": free_port(), "data_dir": Path(tmp) / "data", "log_level": "warning"},
            memory={"source": "declared", "capacity_gib": 100},
        )
        app = create_app(settings)
        server = build_server(settings, app)
        task = asyncio.create_task(server.serve(sockets=[listen(settings.server)]))
        while not server.started:
            await asyncio.sleep(0.05)
        ctx = app.state.ctx
        try:
            for i in range(count):
                name = f"d{i:04d}"
                dep = Deployment(
                    id="",
                    name=name,
                    served_name=name,
                    engine="command",
                    memory_gib=1,
                    mode=Mode.ON_DEMAND,
                    command=["true"],
                )
                ctx.deployer.create(dep, user=None, start=False)
            base = f"http://127.0.0.1:{settings.server.port}{settings.server.base_path}"
            headers = {"Authorization": f"Bearer {ctx.admin_token}"}
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:
                lists = []
                for _ in range(rounds):
                    began = time.perf_counter()
                    resp = await client.get("/api/deployments")
                    lists.append(time.perf_counter() - began)
                    assert resp.status_code == 200 and len(resp.json()) == count, resp.status_code

            def full_check() -> None:
                for dep in ctx.deployer.peek_all():
                    ctx.live.mark(dep.id)
                ctx.live.check()

            return {
                "GET /api/deployments": min(lists),
                "live status, full check": best(full_check, rounds),
                "statuses of all": best(lambda: ctx.live.statuses(ctx.deployer.peek_all()), rounds),
            }
        finally:
            server.should_exit = True
            await task


def child(src: Path, count: int, rounds: int) -> dict[str, float]:
    """The figures of the code in ``src``, measured in a child process."""
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    cmd = [sys.executable, __file__, "--count", str(count), "--rounds", str(rounds), "--json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline-src", type=Path)
    parser.add_argument("--turns", type=int, default=3, help="children per version, taken in turns (with a baseline)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child's output
    args = parser.parse_args()
    if args.json:
        print(json.dumps(asyncio.run(measure(args.count, args.rounds))))
        return
    if args.baseline_src is None:
        figures, baseline = asyncio.run(measure(args.count, args.rounds)), None
    else:  # in turns, so that a change of the machine's load falls on both alike; the best of each
        here = Path(__file__).resolve().parent.parent / "src"
        runs: dict[str, list[dict[str, float]]] = {"here": [], "baseline": []}
        for _ in range(args.turns):
            runs["baseline"].append(child(args.baseline_src, args.count, args.rounds))
            runs["here"].append(child(here, args.count, args.rounds))
        figures, baseline = (
            {k: min(r[k] for r in runs[which]) for k in runs[which][0]} for which in ("here", "baseline")
        )
    print(
        f"{args.count} deployments, best of {args.rounds} rounds"
        + (f" x {args.turns} turns" if baseline else "")
        + " (ms)"
    )
    for name, took in figures.items():
        line = f"  {name:26} {took * 1000:8.1f}"
        if baseline is not None:
            line += f"   baseline {baseline[name] * 1000:8.1f}   ratio {took / baseline[name]:.2f}"
        print(line)


if __name__ == "__main__":
    main()
