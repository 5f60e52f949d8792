#!/usr/bin/env python3
"""Benchmark of dgxmm's on-demand gateway against nginx and a direct connection, in one run.

    .venv/bin/python bench/gateway.py [--quick] [--json FILE]

It starts, side by side on 127.0.0.1 (and nothing else: all traffic stays on 127.0.0.0/8):

* dgxmm as its own process (``.venv/bin/dgxmm serve --config <generated toml>``) with an
  on-demand key file, ``allowed_cidrs = ["127.0.0.2/32"]`` and one on-demand ``command``
  deployment running tests/engines/testengine.py (48-word reply: 51 SSE events per stream),
  created through the admin API and started by a first request through the gateway;
* nginx (Debian's; installed with apt-get when missing) as a non-daemon child with its own
  config, pid and logs in a temp dir: one worker, ``proxy_buffering off``,
  ``proxy_http_version 1.1``, keepalive upstream, pointing at the SAME engine dgxmm started.

A separate load-generator process (this file with ``--loadgen``; aiohttp, on uvloop when it is
installed, bound to 127.0.0.2) then measures, for direct / nginx / gateway in turn (the order
rotates between rounds):

1. time to first body chunk (TTFB) of streaming chat completions, p50 and p99, at c=1 and c=64;
2. streaming throughput at c=16, in SSE events ("chunks") per second;
3. non-streaming requests per second at c=16;
4. N concurrent paced streams (1000; engine chunk delay 50 ms set live through the engine's
   ``POST /_test/config``, so 2.5 s per stream; the starts are spread evenly over 1 s so the
   engine does not answer 1000 requests in one burst): how many complete within 60 s,
   inter-chunk latency (time between body reads), and the proxy process's peak RSS (VmRSS,
   sampled every 50 ms) and CPU seconds (utime+stime).

The proxy's CPU time is also read around every timed window (the load generator prints START and
END markers), giving CPU per request. The result is one markdown table with ratios to direct and
to nginx, and the targets (streaming >= 0.8x nginx chunks/s, added TTFB p50 <= 1 ms at c=1, all
paced streams complete) with whether each is met.

Every process started here is stopped at the end, also on errors, SIGTERM and Ctrl-C; every loop
is bounded in count and time. ``--quick`` shrinks everything so the whole run takes about a
minute (a smoke run); the full run takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import os
import platform
import queue
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEST_ENGINE = ROOT / "tests" / "engines" / "testengine.py"
KEY = "sk-bench-ondemand-key"
CALLER = "127.0.0.2"  # the gateway's allowed peer; every load-generator connection binds to it
SERVED = "bench"
REPLY = " ".join(f"word{i:02d}" for i in range(48))  # 48 deltas + role + finish + [DONE] = 51 events
EVENTS_PER_STREAM = 51
TARGETS = ("direct", "nginx", "gateway")
PACED_DELAY = 0.05
PACED_DEADLINE = 60.0
PACED_RAMP = 1.0  # the paced streams start evenly spread over this many seconds (each lasts 2.5 s)


# --------------------------------------------------------------------------------------------
# Small helpers shared by both processes
# --------------------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def chat_body(stream: bool, max_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": SERVED, "messages": [{"role": "user", "content": "Say something."}],
                            "stream": stream}  # fmt: skip
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


# --------------------------------------------------------------------------------------------
# Load generator (runs in its own process: ``gateway.py --loadgen '<json spec>'``)
# --------------------------------------------------------------------------------------------


class BadStatus(Exception):
    pass


def _mark(word: str, payload: Any = None) -> None:
    line = word if payload is None else f"{word} {json.dumps(payload)}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _stream_once(session: Any, url: str, data: bytes, headers: dict[str, str],
                       gaps: list[float] | None = None) -> tuple[float, int, float]:  # fmt: skip
    """One streaming request: (seconds to the first body chunk, SSE events, total seconds)."""
    t0 = time.perf_counter()
    first = math.nan
    events = 0
    tail_nl = False
    prev = t0
    async with session.post(url, data=data, headers=headers) as resp:
        if resp.status != 200:
            raise BadStatus(f"{resp.status}: {(await resp.read())[:200]!r}")
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            if math.isnan(first):
                first = now - t0
            elif gaps is not None:
                gaps.append(now - prev)
            prev = now
            events += chunk.count(b"\n\n") + (1 if tail_nl and chunk[:1] == b"\n" else 0)
            tail_nl = chunk[-1:] == b"\n"
    return first, events, time.perf_counter() - t0


async def _plain_once(session: Any, url: str, data: bytes, headers: dict[str, str]) -> int:
    async with session.post(url, data=data, headers=headers) as resp:
        raw = await resp.read()
        if resp.status != 200:
            raise BadStatus(f"{resp.status}: {raw[:200]!r}")
        return len(raw)


class Tally:
    def __init__(self, max_errors: int = 50) -> None:
        self.ok = 0
        self.errors = 0
        self.first_error: str | None = None
        self.events = 0
        self.ttfb: list[float] = []
        self.max_errors = max_errors

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"

    @property
    def failing(self) -> bool:
        return self.errors >= self.max_errors


async def _workers(concurrency: int, deadline: float, max_requests: int, one: Any, tally: Tally) -> None:
    """``concurrency`` loops, each issuing requests until the deadline or the request cap."""
    issued = 0

    async def loop() -> None:
        nonlocal issued
        while time.perf_counter() < deadline and issued < max_requests and not tally.failing:
            issued += 1
            try:
                await one()
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 - counted and reported
                tally.error(exc)

    await asyncio.gather(*(loop() for _ in range(concurrency)))


async def _set_engine(session: Any, engine: str, **config: Any) -> None:
    async with session.post(f"{engine}/_test/config", json=config) as resp:
        if resp.status != 200:
            raise BadStatus(f"engine config {resp.status}")
        await resp.read()


async def loadgen(spec: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    mode = spec["mode"]
    url = spec["url"]
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    concurrency = int(spec.get("concurrency", 1))
    connector = aiohttp.TCPConnector(limit=0, local_addr=(CALLER, 0), keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=spec.get("request_timeout", 120), sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        if mode == "paced":
            return await _paced(session, spec, url, headers)
        stream = mode in ("ttfb", "stream")
        data = json.dumps(chat_body(stream)).encode()
        tally = Tally()

        if stream:
            async def one() -> None:
                first, events, _ = await _stream_once(session, url, data, headers)
                if events != EVENTS_PER_STREAM:
                    raise BadStatus(f"stream ended after {events} events")
                tally.ok += 1
                tally.events += events
                tally.ttfb.append(first)
        else:
            async def one() -> None:
                await _plain_once(session, url, data, headers)
                tally.ok += 1

        # Warm-up (untimed): open the connections the timed part will use.
        warm = Tally()
        for _ in range(2):
            results = await asyncio.gather(*(one() for _ in range(concurrency)), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    warm.error(r)
        if warm.errors == 2 * concurrency:
            return {"error": f"warm-up failed: {warm.first_error}"}
        tally.__init__()  # type: ignore[misc]  # forget the warm-up's counts

        count = int(spec.get("count", 10_000_000))
        duration = float(spec.get("duration", 3600))
        _mark("START")
        t0 = time.perf_counter()
        await _workers(concurrency, t0 + duration, count, one, tally)
        wall = time.perf_counter() - t0
        _mark("END")
        return {"ok": tally.ok, "errors": tally.errors, "first_error": tally.first_error, "wall": wall,
                "events": tally.events, "ttfb": tally.ttfb}  # fmt: skip


async def _paced(session: Any, spec: dict[str, Any], url: str, headers: dict[str, str]) -> dict[str, Any]:
    import aiohttp

    n = int(spec["streams"])
    engine = spec["engine"]
    plain = json.dumps(chat_body(False)).encode()
    streamed = json.dumps(chat_body(True)).encode()
    await _set_engine(session, engine, chunk_delay=0)
    try:
        # Warm-up (untimed): n concurrent quick requests leave up to n keep-alive connections in
        # the client's pool (and the proxy's upstream pool), so the timed part opens none.
        warm = await asyncio.wait_for(asyncio.gather(
            *(_plain_once(session, url, plain, headers) for _ in range(n)), return_exceptions=True), 60)  # fmt: skip
        warm_errors = [r for r in warm if isinstance(r, BaseException)]
        await _set_engine(session, engine, chunk_delay=spec.get("delay", PACED_DELAY))

        gaps: list[float] = []
        ttfb: list[float] = []
        durations: list[float] = []
        tally = Tally(max_errors=10**9)

        ramp = float(spec.get("ramp", 0))

        async def one(i: int) -> None:
            if ramp:
                await asyncio.sleep(i * ramp / n)
            try:
                first, events, total = await _stream_once(session, url, streamed, headers, gaps)
            except Exception as exc:  # noqa: BLE001 - counted
                tally.error(exc)
                return
            if events == EVENTS_PER_STREAM:
                tally.ok += 1
                ttfb.append(first)
                durations.append(total)
            else:
                tally.error(BadStatus(f"stream ended after {events} events"))

        _mark("START")
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        done, pending = await asyncio.wait(tasks, timeout=float(spec.get("deadline", PACED_DEADLINE)))
        wall = time.perf_counter() - t0
        _mark("END")
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        with contextlib.suppress(Exception):
            async with aiohttp.ClientSession() as fresh:  # the pool may be busy with cancelled streams
                await _set_engine(fresh, engine, chunk_delay=0)
    return {"streams": n, "ok": tally.ok, "errors": tally.errors, "first_error": tally.first_error,
            "unfinished": len(pending), "wall": wall, "warm_errors": len(warm_errors),
            "ttfb_p50": pct(ttfb, 50), "ttfb_p99": pct(ttfb, 99),
            "duration_p50": pct(durations, 50), "duration_p99": pct(durations, 99),
            "last_done": max(durations, default=math.nan),
            "gap_p50": pct(gaps, 50), "gap_p99": pct(gaps, 99), "gap_max": max(gaps, default=math.nan),
            "gaps": len(gaps)}  # fmt: skip


def loadgen_main(raw: str) -> int:
    spec = json.loads(raw)
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        try:
            import uvloop
        except ImportError:
            result = asyncio.run(loadgen(spec))
        else:
            result = uvloop.run(loadgen(spec))
    except KeyboardInterrupt:
        return 130
    _mark("RESULT", result)
    return 0


# --------------------------------------------------------------------------------------------
# Orchestrator: processes, measurement, report
# --------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when this benchmark dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)
    return total


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
    return total


class RssSampler(threading.Thread):
    """Peak summed VmRSS of some processes, every 50 ms until stopped."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = rss_kib(pids) if pids else 0
        self.halt = threading.Event()

    def run(self) -> None:
        while self.pids and not self.halt.wait(0.05):
            self.peak = max(self.peak, rss_kib(self.pids))

    def stop(self) -> int:
        self.halt.set()
        self.join(2)
        return self.peak


class Children:
    """Processes this benchmark started, stopped in reverse order (by pid, nothing broader)."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.extra: list[tuple[str, int]] = []  # grandchildren to make sure of (the engine)

    def spawn(self, name: str, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        out = log_path.open("ab")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=ROOT,
                                    start_new_session=True, preexec_fn=_die_with_parent)  # fmt: skip
        finally:
            out.close()
        self.procs.append((name, proc))
        return proc

    def stop_all(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                log(f"stopping {name} (pid {proc.pid})")
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=35)
                except subprocess.TimeoutExpired:
                    log(f"{name} ignored SIGTERM: killing it")
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    proc.wait(timeout=5)
        for name, pid in self.extra:
            with contextlib.suppress(OSError):
                if "testengine" in Path(f"/proc/{pid}/cmdline").read_text():
                    log(f"{name} (pid {pid}) outlived dgxmm: killing it")
                    os.kill(pid, signal.SIGKILL)
        self.procs.clear()
        self.extra.clear()


def tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def wait_for(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None,
             log_path: Path | None = None) -> Any:  # fmt: skip
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}\n{tail(log_path) if log_path else ''}")
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not ready within {timeout:g} s (last error: {last})"
                       + (f"\n{tail(log_path)}" if log_path else ""))  # fmt: skip


def ensure_nginx() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("nginx is not installed (apt-get install -y nginx-light) and this is not root")
    log("installing nginx-light with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "nginx-light"]
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, timeout=600).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, stdout=subprocess.DEVNULL, timeout=600)
        subprocess.run(install, env=env, stdout=subprocess.DEVNULL, timeout=600)
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if not found:
        raise RuntimeError("could not install nginx")
    return found


NGINX_CONF = """\
# Generated by bench/gateway.py: one worker, unbuffered streaming proxy with a keepalive upstream.
worker_processes 1;
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
worker_rlimit_nofile 16384;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_timeout 75s;
    keepalive_requests 10000000;
    upstream engine {{
        server 127.0.0.1:{engine_port};
        keepalive 2048;
        keepalive_requests 10000000;
        keepalive_timeout 75s;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""

DGXMM_TOML = """\
# Generated by bench/gateway.py
[server]
host = "127.0.0.1"
port = {port}
data_dir = "{data}"
log_level = "warning"

[ondemand]
key_file = "{key}"
allowed_cidrs = ["{caller}/32"]

{upstream}
[memory]
source = "declared"
capacity_gib = 100
"""


@dataclass
class Profile:
    rounds: int  # rounds of the TTFB phases
    throughput_rounds: int  # rounds of the chunks/s and req/s phases
    ttfb1_count: int  # requests per target and round at c=1
    ttfb64_s: float  # seconds per target and round at c=64
    stream_s: float
    plain_s: float
    paced_streams: int


FULL = Profile(rounds=6, throughput_rounds=9, ttfb1_count=500, ttfb64_s=2, stream_s=2, plain_s=2,
               paced_streams=1000)
QUICK = Profile(rounds=1, throughput_rounds=1, ttfb1_count=200, ttfb64_s=1.5, stream_s=2, plain_s=2, paced_streams=1000)


@dataclass
class Setup:
    tmp: Path
    children: Children
    urls: dict[str, str] = field(default_factory=dict)
    pids: dict[str, list[int]] = field(default_factory=dict)
    engine: str = ""
    engine_pid: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    profile_dir: Path | None = None
    upstream_max: int | None = None  # [ondemand] upstream_max_connections; None: dgxmm's default
    idle_rss_kib: dict[str, int] = field(default_factory=dict)
    pyspy: str | None = None  # py-spy binary: profile the gateway during phases 2 and 3


def start_servers(setup: Setup) -> None:
    import httpx

    tmp, children = setup.tmp, setup.children
    data = tmp / "data"
    data.mkdir()
    key_file = tmp / "ondemand.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    port = free_port()
    config = tmp / "dgxmm.toml"
    upstream = f"upstream_max_connections = {setup.upstream_max}\n" if setup.upstream_max else ""
    config.write_text(DGXMM_TOML.format(port=port, data=data, key=key_file, caller=CALLER, upstream=upstream))
    dgxmm_bin = Path(sys.executable).parent / "dgxmm"
    argv = [str(dgxmm_bin), "serve", "--config", str(config)] if dgxmm_bin.exists() else \
        [sys.executable, "-m", "dgxmm.cli", "serve", "--config", str(config)]  # fmt: skip
    dg_log = tmp / "dgxmm.log"
    log(f"starting dgxmm on 127.0.0.1:{port}")
    dg = children.spawn("dgxmm", argv, dg_log)
    base = f"http://127.0.0.1:{port}/dgxmm"
    token_file = data / "admin-token"
    wait_for("dgxmm admin API", lambda: token_file.exists() and token_file.read_text().strip(), 30, dg, dg_log)
    admin = httpx.Client(base_url=f"{base}/api", timeout=30,
                         headers={"Authorization": f"Bearer {token_file.read_text().strip()}"})  # fmt: skip
    with admin:
        wait_for("dgxmm admin API", lambda: admin.get("/deployments").status_code == 200, 30, dg, dg_log)
        command = [sys.executable, str(TEST_ENGINE), "--port", "{port}", "--served-name", "{served_name}",
                   "--reply", REPLY, "--chunk-delay", "0", "--max-num-seqs", "4096"]  # fmt: skip
        resp = admin.post("/deployments", json={"name": SERVED, "engine": "command", "memory_gib": 1,
                                                "mode": "on_demand", "idle_timeout_s": 3600,
                                                "command": command})  # fmt: skip
        if resp.status_code != 201:
            raise RuntimeError(f"creating the deployment: {resp.status_code} {resp.text}")
        dep_id = resp.json()["id"]
        gateway_url = f"{base}/ondemand/{dep_id}/v1/chat/completions"
        log(f"deployment {dep_id} created; first request through the gateway starts its engine")
        caller = httpx.Client(transport=httpx.HTTPTransport(local_address=CALLER), timeout=120,
                              headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
        with caller:
            warm = caller.post(gateway_url, json=chat_body(False))
            if warm.status_code != 200:
                raise RuntimeError(f"warm-up through the gateway: {warm.status_code} {warm.text}\n{tail(dg_log)}")
        view = admin.get(f"/deployments/{dep_id}").json()
        if view["state"] != "ready" or not view["base_url"]:
            raise RuntimeError(f"deployment not ready after the warm-up: {view['state']}")
    setup.engine = view["base_url"]
    engines = [pid for pid in children_of(dg.pid) if "testengine" in Path(f"/proc/{pid}/cmdline").read_text()]
    setup.engine_pid = engines[0] if engines else 0
    if setup.engine_pid:
        children.extra.append(("engine", setup.engine_pid))
    log(f"engine ready at {setup.engine} (pid {setup.engine_pid})")

    nginx = ensure_nginx()
    ng_dir = tmp / "nginx"
    ng_dir.mkdir()
    ng_dir.chmod(0o755)  # workers may run as an unprivileged user
    tmp.chmod(0o711)
    ng_port = free_port()
    engine_port = int(setup.engine.rsplit(":", 1)[1])
    ng_conf = ng_dir / "nginx.conf"
    ng_conf.write_text(NGINX_CONF.format(dir=ng_dir, port=ng_port, engine_port=engine_port))
    ng_argv = [nginx, "-p", str(ng_dir), "-c", str(ng_conf), "-e", str(ng_dir / "error.log")]
    check = subprocess.run([*ng_argv, "-t"], capture_output=True, text=True, timeout=30)
    if check.returncode != 0:
        raise RuntimeError(f"nginx -t: {check.stderr}")
    log(f"starting nginx on 127.0.0.1:{ng_port}")
    ng = children.spawn("nginx", ng_argv, ng_dir / "stdout.log")
    ng_base = f"http://127.0.0.1:{ng_port}"
    wait_for("nginx", lambda: httpx.get(f"{ng_base}/v1/models", timeout=5).status_code == 200, 20, ng,
             ng_dir / "error.log")  # fmt: skip
    ng_pids = [ng.pid, *wait_for("nginx worker", lambda: children_of(ng.pid), 10)]

    setup.urls = {"direct": f"{setup.engine}/v1/chat/completions", "nginx": f"{ng_base}/v1/chat/completions",
                  "gateway": gateway_url}  # fmt: skip
    setup.pids = {"direct": [], "nginx": ng_pids, "gateway": [dg.pid]}
    setup.idle_rss_kib = {t: rss_kib(p) for t, p in setup.pids.items()}
    setup.versions = {
        "nginx": subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1],
        "python": platform.python_version(),
        **{name: _version(name) for name in ("aiohttp", "uvicorn", "uvloop", "httptools", "starlette")},
    }


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def clear_engine_records(setup: Setup) -> None:
    """The test engine records every request; drop them so its memory stays flat."""
    import httpx

    with contextlib.suppress(Exception):
        httpx.delete(f"{setup.engine}/_test/requests", timeout=30)


def reset_engine(setup: Setup) -> None:
    import httpx

    with contextlib.suppress(Exception):
        httpx.post(f"{setup.engine}/_test/config", json={"chunk_delay": 0}, timeout=30)


@dataclass
class Run:
    result: dict[str, Any]
    cpu_s: float  # proxy CPU seconds in the timed window
    engine_cpu_s: float
    peak_rss_kib: int
    wall: float


def run_load(setup: Setup, target: str, spec: dict[str, Any], timeout: float) -> Run:
    """One load-generator process; the proxy is measured between its START and END markers."""
    spec = {**spec, "url": setup.urls[target], "engine": setup.engine}
    argv = [sys.executable, str(Path(__file__).resolve()), "--loadgen", json.dumps(spec)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, cwd=ROOT, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    pids = setup.pids[target]
    engine = [setup.engine_pid] if setup.engine_pid else []
    sampler: RssSampler | None = None
    cpu0 = eng0 = cpu1 = eng1 = 0.0
    t0 = t1 = 0.0
    result: dict[str, Any] | None = None
    deadline = time.monotonic() + timeout
    profiler: subprocess.Popen[bytes] | None = None
    profiler_out = None
    if setup.pyspy and target == "gateway" and spec["mode"] in ("stream", "plain") and setup.profile_dir:
        setup.profile_dir.mkdir(parents=True, exist_ok=True)
        profiler_out = setup.profile_dir / f"gateway-{spec['mode']}-{time.strftime('%H%M%S')}.txt"
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"load generator for {target} did not finish within {timeout:g} s")
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                break
            if line == "START":
                if profiler_out is not None:
                    profiler = subprocess.Popen(
                        [setup.pyspy, "record", "--nonblocking", "-r", "100", "-f", "raw", "-o", str(profiler_out),
                         "-d", str(max(1, int(spec.get("duration", 5)))), "-p", str(pids[0])],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
                cpu0, eng0, t0 = cpu_seconds(pids), cpu_seconds(engine), time.monotonic()
                sampler = RssSampler(pids)
                sampler.start()
            elif line == "END":
                cpu1, eng1, t1 = cpu_seconds(pids), cpu_seconds(engine), time.monotonic()
                peak = sampler.stop() if sampler else 0
                sampler = None
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        proc.wait(timeout=10)
    finally:
        if sampler is not None:
            sampler.stop()
        if profiler is not None:
            try:
                profiler.wait(timeout=30)
            except subprocess.TimeoutExpired:
                profiler.kill()
                profiler.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    if result is None or "error" in result:
        raise RuntimeError(f"load generator for {target} failed: {result and result.get('error')} "
                           f"(exit {proc.returncode})")  # fmt: skip
    return Run(result, cpu1 - cpu0, eng1 - eng0, peak, t1 - t0)


def measure(setup: Setup, profile: Profile) -> dict[str, Any]:
    results: dict[str, Any] = {t: {} for t in TARGETS}

    def rounds(name: str, spec: dict[str, Any], timeout: float, count: int) -> dict[str, list[Run]]:
        runs: dict[str, list[Run]] = {t: [] for t in TARGETS}
        for r in range(count):
            order = TARGETS[r % 3:] + TARGETS[:r % 3]
            for target in order:
                run = run_load(setup, target, spec, timeout)
                res = run.result
                log(f"{name} round {r + 1}/{count} {target}: {res['ok']} ok, {res['errors']} errors"
                    f" in {res['wall']:.1f} s" + (f" ({res['first_error']})" if res["first_error"] else ""))
                runs[target].append(run)
                clear_engine_records(setup)
        return runs

    def ttfb(name: str, runs: dict[str, list[Run]]) -> None:
        for target, rs in runs.items():
            samples = [x for run in rs for x in run.result["ttfb"]]
            requests = sum(run.result["ok"] for run in rs)
            results[target][name] = {
                "p50_ms": pct(samples, 50) * 1e3, "p99_ms": pct(samples, 99) * 1e3, "n": len(samples),
                "errors": sum(run.result["errors"] for run in rs),
                "req_s": requests / max(1e-9, sum(run.result["wall"] for run in rs)),
                "cpu_us_per_req": 1e6 * sum(run.cpu_s for run in rs) / max(1, requests),
            }  # fmt: skip

    log("phase 1a: TTFB at c=1")
    ttfb("ttfb_c1", rounds("ttfb c=1", {"mode": "ttfb", "concurrency": 1, "count": profile.ttfb1_count},
                           300 + profile.ttfb1_count * 0.2, profile.rounds))  # fmt: skip
    log("phase 1b: TTFB at c=64")
    ttfb("ttfb_c64", rounds("ttfb c=64", {"mode": "ttfb", "concurrency": 64, "duration": profile.ttfb64_s},
                            300 + profile.ttfb64_s, profile.rounds))  # fmt: skip

    log("phase 2: streaming chunks/s at c=16")
    runs = rounds("stream c=16", {"mode": "stream", "concurrency": 16, "duration": profile.stream_s},
                  300 + profile.stream_s, profile.throughput_rounds)  # fmt: skip
    for target, rs in runs.items():
        rates = [run.result["events"] / run.result["wall"] for run in rs]
        requests = sum(run.result["ok"] for run in rs)
        events = sum(run.result["events"] for run in rs)
        results[target]["stream_c16"] = {
            "chunks_s": median(rates), "rounds": rates,
            "errors": sum(run.result["errors"] for run in rs),
            "cpu_us_per_req": 1e6 * sum(run.cpu_s for run in rs) / max(1, requests),
            "cpu_us_per_chunk": 1e6 * sum(run.cpu_s for run in rs) / max(1, events),
            "engine_cpu_us_per_chunk": 1e6 * sum(run.engine_cpu_s for run in rs) / max(1, events),
        }  # fmt: skip

    log("phase 3: non-streaming req/s at c=16")
    runs = rounds("plain c=16", {"mode": "plain", "concurrency": 16, "duration": profile.plain_s},
                  300 + profile.plain_s, profile.throughput_rounds)  # fmt: skip
    for target, rs in runs.items():
        rates = [run.result["ok"] / run.result["wall"] for run in rs]
        requests = sum(run.result["ok"] for run in rs)
        results[target]["plain_c16"] = {
            "req_s": median(rates), "rounds": rates,
            "errors": sum(run.result["errors"] for run in rs),
            "cpu_us_per_req": 1e6 * sum(run.cpu_s for run in rs) / max(1, requests),
        }  # fmt: skip

    n = profile.paced_streams
    log(f"phase 4: {n} concurrent paced streams ({PACED_DELAY * 1e3:g} ms per chunk)")
    for target in TARGETS:
        try:
            run = run_load(setup, target, {"mode": "paced", "streams": n, "delay": PACED_DELAY, "ramp": PACED_RAMP,
                                           "deadline": PACED_DEADLINE, "request_timeout": None},
                           PACED_DEADLINE + 200)  # fmt: skip
        finally:
            reset_engine(setup)
        res = run.result
        log(f"paced {target}: {res['ok']}/{n} complete, {res['errors']} errors, {res['unfinished']} unfinished,"
            f" last done after {res['last_done']:.1f} s" + (f" ({res['first_error']})" if res["first_error"] else ""))
        results[target]["paced"] = {**res, "cpu_s": run.cpu_s, "engine_cpu_s": run.engine_cpu_s,
                                    "peak_rss_mib": run.peak_rss_kib / 1024}  # fmt: skip
        clear_engine_records(setup)
        time.sleep(1)
    return results


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def round_ratio(a: list[float], b: list[float]) -> float:
    """Median of the per-round ratios a[r] / b[r]."""
    return median([x / y for x, y in zip(a, b) if y]) if a and b else math.nan


def _f(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ratio(a: float, b: float, ref: str) -> str:
    if not b or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}x {ref}"


def report(results: dict[str, Any], profile: Profile, setup: Setup) -> tuple[str, list[tuple[str, bool, str]]]:
    d, n, g = (results[t] for t in TARGETS)
    rows: list[list[str]] = []

    def ratio_row(label: str, key: str, value: str, scale: float = 1.0) -> None:
        """Medians over the rounds; each ratio is the median of per-round ratios (the targets of one
        round run back to back, so slow drifts of the machine's speed cancel out)."""
        dv, nv, gv = (x[key][value] * scale for x in (d, n, g))
        dr, nr, gr = (x[key]["rounds"] for x in (d, n, g))
        rows.append([label, _f(dv, 0), _f(nv, 0), _f(gv, 0), f"{round_ratio(nr, dr):.2f}x direct",
                     f"{round_ratio(gr, dr):.2f}x direct", f"{round_ratio(gr, nr):.2f}x nginx"])  # fmt: skip

    def latency_rows(label: str, key: str, pct_key: str, scale: float = 1.0) -> None:
        dv, nv, gv = (x[key][pct_key] * scale for x in (d, n, g))
        rows.append([f"{label} (ms)", _f(dv), _f(nv), _f(gv), _ratio(nv, dv, "direct"), _ratio(gv, dv, "direct"),
                     _ratio(gv, nv, "nginx")])  # fmt: skip
        an, ag = nv - dv, gv - dv
        rows.append([f"  added vs direct (ms)", "0", f"{an:+.2f}", f"{ag:+.2f}", "", "",
                     _ratio(ag, an, "nginx") if an > 0 else "-"])  # fmt: skip

    latency_rows("TTFB p50, c=1", "ttfb_c1", "p50_ms")
    latency_rows("TTFB p99, c=1", "ttfb_c1", "p99_ms")
    latency_rows("TTFB p50, c=64", "ttfb_c64", "p50_ms")
    latency_rows("TTFB p99, c=64", "ttfb_c64", "p99_ms")
    ratio_row("streaming chunks/s, c=16", "stream_c16", "chunks_s")
    ratio_row("  (streams/s, c=16)", "stream_c16", "chunks_s", 1 / EVENTS_PER_STREAM)
    ratio_row("non-streaming req/s, c=16", "plain_c16", "req_s")
    for label, key in (("proxy CPU us per stream, c=16", "stream_c16"), ("proxy CPU us per request, c=16", "plain_c16"),
                       ("proxy CPU us per stream, c=1", "ttfb_c1")):  # fmt: skip
        nv, gv = n[key]["cpu_us_per_req"], g[key]["cpu_us_per_req"]
        rows.append([label, "-", _f(nv, 0), _f(gv, 0), "", "", _ratio(gv, nv, "nginx")])
    streams = profile.paced_streams
    rows.append([f"paced: streams complete in {PACED_DEADLINE:g} s", *(f"{x['paced']['ok']}/{streams}" for x in (d, n, g)),
                 "", "", ""])  # fmt: skip
    rows.append(["paced: last stream done after (s)", *(_f(x["paced"]["last_done"]) for x in (d, n, g)), "", "", ""])
    latency_rows("paced: inter-chunk p50", "paced", "gap_p50", 1e3)
    latency_rows("paced: inter-chunk p99", "paced", "gap_p99", 1e3)
    latency_rows("paced: TTFB p99", "paced", "ttfb_p99", 1e3)
    rows.append(["proxy RSS after start-up (MiB)", "-", _f(setup.idle_rss_kib["nginx"] / 1024, 1),
                 _f(setup.idle_rss_kib["gateway"] / 1024, 1), "", "", ""])  # fmt: skip
    rows.append(["paced: proxy peak RSS (MiB)", "-", _f(n["paced"]["peak_rss_mib"], 1), _f(g["paced"]["peak_rss_mib"], 1),
                 "", "", _ratio(g["paced"]["peak_rss_mib"], n["paced"]["peak_rss_mib"], "nginx")])  # fmt: skip
    rows.append(["paced: proxy CPU (s)", "-", _f(n["paced"]["cpu_s"]), _f(g["paced"]["cpu_s"]), "", "",
                 _ratio(g["paced"]["cpu_s"], n["paced"]["cpu_s"], "nginx")])  # fmt: skip
    per_chunk = [1e6 * x["paced"]["cpu_s"] / max(1, x["paced"]["ok"] * EVENTS_PER_STREAM) for x in (n, g)]
    rows.append(["paced: proxy CPU us per chunk", "-", _f(per_chunk[0], 1), _f(per_chunk[1], 1), "", "",
                 _ratio(per_chunk[1], per_chunk[0], "nginx")])  # fmt: skip

    header = ["metric", "direct", "nginx", "gateway", "nginx/direct", "gateway/direct", "gateway/nginx"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"  # fmt: skip

    table = [line(header), "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2))
                                          for i, w in enumerate(widths)) + "|"]  # fmt: skip
    table += [line(r) for r in rows]

    ratio = round_ratio(g["stream_c16"]["rounds"], n["stream_c16"]["rounds"])
    added = g["ttfb_c1"]["p50_ms"] - d["ttfb_c1"]["p50_ms"]
    done = g["paced"]["ok"]
    targets = [
        ("gateway streaming chunks/s >= 0.8x nginx (c=16)", ratio >= 0.8, f"{ratio:.2f}x nginx"),
        ("gateway added TTFB p50 <= 1 ms (c=1)", added <= 1.0, f"{added:+.2f} ms"),
        (f"gateway: all {streams} paced streams complete within {PACED_DEADLINE:g} s", done == streams,
         f"{done}/{streams}"),
    ]  # fmt: skip
    return "\n".join(table), targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: shorter phases, about a minute")
    parser.add_argument("--json", type=Path, help="also write all numbers to this file")
    parser.add_argument("--upstream-max-connections", type=int, metavar="N",
                        help="set dgxmm's [ondemand] upstream_max_connections (default: dgxmm's, 256)")
    parser.add_argument("--py-spy", metavar="BIN", help="profile the gateway with this py-spy binary during "
                        "phases 2 and 3 (raw stacks in --profile-dir); perturbs the numbers")
    parser.add_argument("--profile-dir", type=Path, default=Path("/tmp/dgxmm-bench-profiles"))
    parser.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loadgen:
        return loadgen_main(args.loadgen)

    profile = QUICK if args.quick else FULL
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard == resource.RLIM_INFINITY else max(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # inherited by dgxmm, its engine, nginx
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 4 * profile.paced_streams + 256:
        log(f"warning: RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} is low for "
            f"{profile.paced_streams} streams")  # fmt: skip

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    children = Children()
    tmp = Path(tempfile.mkdtemp(prefix="dgxmm-bench-"))
    started = time.time()
    try:
        setup = Setup(tmp, children, upstream_max=args.upstream_max_connections, pyspy=args.py_spy)
        setup.profile_dir = args.profile_dir
        start_servers(setup)
        results = measure(setup, profile)
        table, targets = report(results, profile, setup)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            children.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)

    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.machine())  # fmt: skip
    versions = ", ".join(f"{k} {v}" for k, v in setup.versions.items())
    print()
    print(f"# dgxmm gateway benchmark, {time.strftime('%Y-%m-%d %H:%M %Z')} ({'quick' if args.quick else 'full'} run,"
          f" {time.time() - started:.0f} s)")
    print(f"machine: {os.cpu_count()} cores ({cpu}); {versions}")
    print(f"engine: tests/engines/testengine.py, {EVENTS_PER_STREAM} SSE events per stream; "
          f"{profile.rounds} rounds per TTFB phase, {profile.throughput_rounds} per throughput phase (order"
          f" rotated; throughput: median of rounds, ratios: median of"
          f" per-round ratios; latency: percentiles of all rounds' samples); nginx: 1 worker; dgxmm: 1 process,"
          f" upstream_max_connections = {setup.upstream_max or 'default (256)'}; paced streams start over"
          f" {PACED_RAMP:g} s")
    print()
    print(table)
    print()
    print("Targets:")
    for label, ok, value in targets:
        print(f"  [{'MET' if ok else 'MISSED'}] {label}: {value}")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": args.quick,
                                         "cores": os.cpu_count(), "cpu": cpu, "versions": setup.versions,
                                         "results": _strip(results),
                                         "targets": [{"target": l, "met": ok, "value": v} for l, ok, v in targets],
                                         "table": table}, indent=1))  # fmt: skip
    return 0


def _strip(results: dict[str, Any]) -> dict[str, Any]:
    """The results without raw sample lists (kept small for --json)."""
    return {t: {k: {kk: vv for kk, vv in v.items() if kk != "ttfb"} if isinstance(v, dict) else v
                for k, v in r.items()} for t, r in results.items()}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
