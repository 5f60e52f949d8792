#!/usr/bin/env python3
"""Time to first byte and CPU per request of two dgxmm checkouts, measured in the same window, alternating.

    .venv/bin/python bench/ttfb_ab.py A_CHECKOUT B_CHECKOUT [--requests N] [--cpu-rounds R]

Each checkout must have its own ``.venv`` with dgxmm installed (``pip install -e .``). Both run
``dgxmm serve`` side by side on 127.0.0.1, each with one on-demand deployment of its own
tests/engines/testengine.py (48-word reply), started by a first request. Then one client (aiohttp
on uvloop, bound to 127.0.0.2, one keep-alive connection per gateway) sends streaming chat
completions at concurrency 1, alternating between the two gateways, and reports the time to the
first body chunk, p50 and p90, after a warm-up of 200 requests each. On a shared machine, whose
load moves between two full benchmark runs, this isolates what one checkout adds over the other;
the full comparison against nginx stays bench/gateway.py.

Then, in ``--cpu-rounds`` rounds (order alternating), each gateway gets 3 s of non-streaming and
3 s of streaming chat completions at concurrency 16, and the CPU time (utime + stime from /proc)
its ``dgxmm serve`` process spent is divided by the requests answered: the median per checkout.
CPU time per request moves far less with the machine's load than throughput or latency do.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

KEY = "sk-ttfb-ab"
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
PLAIN = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
WARM = 200
CPU_SECONDS = 3.0
CPU_CONCURRENCY = 16
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def cpu_per_request(client: aiohttp.ClientSession, url: str, pid: int, body: dict[str, object]) -> float:
    """Microseconds of the gateway process's CPU per request, CPU_CONCURRENCY requests at a time."""
    done = 0
    deadline = time.monotonic() + CPU_SECONDS

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            async with client.post(url, json=body) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url}: {resp.status}")
            done += 1

    before = cpu_seconds(pid)
    await asyncio.gather(*(worker() for _ in range(CPU_CONCURRENCY)))
    return 1e6 * (cpu_seconds(pid) - before) / max(1, done)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(checkout: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], Path, int]:
    """``dgxmm serve`` of ``checkout`` in ``tmp``: the process, its data directory and port."""
    key, data, port = tmp / "key", tmp / "data", free_port()
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    env = {
        **os.environ,
        "DGXMM_SERVER__PORT": str(port),
        "DGXMM_SERVER__DATA_DIR": str(data),
        "DGXMM_SERVER__LOG_LEVEL": "warning",
        "DGXMM_MEMORY__CAPACITY_GIB": "100",
        "DGXMM_ONDEMAND__KEY_FILE": str(key),
        "DGXMM_ONDEMAND__ALLOWED_CIDRS": '["127.0.0.2/32"]',
    }
    with (tmp / "dgxmm.log").open("wb") as log:
        proc = subprocess.Popen([str(checkout / ".venv" / "bin" / "dgxmm"), "serve"], env=env, stdout=log, stderr=log)
    return proc, data, port


async def serve(checkout: Path, tmp: Path, admin: aiohttp.ClientSession) -> tuple[subprocess.Popen[bytes], str]:
    """One dgxmm of ``checkout`` with its on-demand test engine; the process and the chat URL."""
    proc, data, port = spawn(checkout, tmp)
    base = f"http://127.0.0.1:{port}/dgxmm"
    deadline = time.monotonic() + 60
    while True:
        token_file = data / "admin-token"
        try:
            headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
            async with admin.get(base + "/api/deployments", headers=headers) as resp:
                if resp.status == 200:
                    break
        except (OSError, aiohttp.ClientError):
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"dgxmm of {checkout} did not start: {(tmp / 'dgxmm.log').read_text()[-2000:]}")
        await asyncio.sleep(0.1)
    command = [
        sys.executable,
        str(checkout / "tests" / "engines" / "testengine.py"),
        "--port",
        "{port}",
        "--served-name",
        "{served_name}",
        "--reply",
        " ".join(["w"] * 48),
        "--max-num-seqs",
        "4096",
    ]
    async with admin.post(
        base + "/api/deployments",
        headers=headers,
        json={
            "name": "m",
            "engine": "command",
            "memory_gib": 1,
            "mode": "on_demand",
            "idle_timeout_s": 3600,
            "command": command,
        },
    ) as resp:
        if resp.status != 201:
            raise RuntimeError(f"creating the deployment: {resp.status} {await resp.text()}")
        dep = (await resp.json())["id"]
    return proc, f"{base}/ondemand/{dep}/v1/chat/completions"


async def main(checkouts: list[Path], requests: int, cpu_rounds: int) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls: dict[str, str] = {}
        async with aiohttp.ClientSession() as admin:
            for checkout in checkouts:
                proc, urls[str(checkout)] = await serve(checkout, Path(tempfile.mkdtemp()), admin)
                procs.append(proc)
        samples: dict[str, list[float]] = {name: [] for name in urls}
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=connector, headers={"Authorization": f"Bearer {KEY}"}) as client:
            for url in urls.values():  # the first request starts each engine
                async with client.post(url, json=BODY) as resp:
                    await resp.read()
            names = list(urls)
            pids = {str(checkout): proc.pid for checkout, proc in zip(checkouts, procs, strict=True)}
            cpu: dict[str, dict[str, list[float]]] = {name: {"plain": [], "stream": []} for name in urls}
            for r in range(cpu_rounds):
                for name in names if r % 2 else names[::-1]:
                    for kind, body in (("plain", PLAIN), ("stream", BODY)):
                        cpu[name][kind].append(await cpu_per_request(client, urls[name], pids[name], body))
            for i in range(requests + WARM):
                for name in names if i % 2 else names[::-1]:
                    start = time.perf_counter()
                    async with client.post(urls[name], json=BODY) as resp:
                        await resp.content.readany()
                        if i >= WARM:
                            samples[name].append(time.perf_counter() - start)
                        await resp.read()
        print(f"TTFB at c=1, {requests} streaming requests each, alternating\n")
        print("| checkout | p50 (ms) | p90 (ms) |\n|---|---:|---:|")
        for name, values in samples.items():
            values.sort()
            print(f"| {name} | {statistics.median(values) * 1e3:.3f} | {values[int(len(values) * 0.9)] * 1e3:.3f} |")
        if cpu_rounds:
            print(
                f"\nCPU of the gateway process per request, c={CPU_CONCURRENCY}, median of {cpu_rounds} rounds"
                f" of {CPU_SECONDS:g} s (min-max)\n"
            )
            print("| checkout | non-streaming (us) | streaming (us) |\n|---|---:|---:|")
            for name, kinds in cpu.items():
                cells = [f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" for v in kinds.values()]
                print(f"| {name} | {cells[0]} | {cells[1]} |")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs=2, type=Path)
    parser.add_argument("--requests", type=int, default=3800)
    parser.add_argument("--cpu-rounds", type=int, default=6, help="rounds of the CPU per request phase (0: none)")
    args = parser.parse_args()
    import uvloop

    uvloop.run(main([path.resolve() for path in args.checkouts], args.requests, args.cpu_rounds))
