"""One load run: a load-generator process that sends the requests, and the orchestrator's side
that measures the proxy while it does.

The load generator is a process of its own (``gateway.py --loadgen '<json spec>'``; aiohttp, on
uvloop when it is installed, bound to the caller address) so that its CPU use is not the
orchestrator's and its event loop does nothing but the load. It warms its connections up
untimed, then prints ``START`` and ``END`` around the timed part and ``RESULT <json>`` last, one
per line on stdout. The orchestrator reads the proxy's (and the engine's) CPU seconds at the two
markers and samples the proxy's RSS in between, so the warm-up and process start-up are never
measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import queue
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procfs import RssSampler, cpu_seconds
from report import pct
from scenario import CALLER, EVENTS_PER_STREAM, KEY, PACED_DEADLINE, PACED_DELAY, ROOT, chat_body
from servers import Setup

if TYPE_CHECKING:
    import aiohttp

ENTRY = Path(__file__).resolve().with_name("gateway.py")  # its hidden --loadgen runs loadgen_main()


class BadStatus(Exception):
    pass


def _mark(word: str, payload: Any = None) -> None:
    line = word if payload is None else f"{word} {json.dumps(payload)}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _stream_once(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str], gaps: list[float] | None = None
) -> tuple[float, int, float]:
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


async def _plain_once(session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]) -> None:
    async with session.post(url, data=data, headers=headers) as resp:
        raw = await resp.read()
        if resp.status != 200:
            raise BadStatus(f"{resp.status}: {raw[:200]!r}")


class Tally:
    """Counts of one timed part; a run stops early once ``max_errors`` requests failed (a broken
    target would otherwise spin through errors until the deadline)."""

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


async def _workers(
    concurrency: int, deadline: float, max_requests: int, one: Callable[[], Awaitable[None]], tally: Tally
) -> None:
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


async def _set_engine(session: aiohttp.ClientSession, engine: str, **config: Any) -> None:
    async with session.post(f"{engine}/_test/config", json=config) as resp:
        if resp.status != 200:
            raise BadStatus(f"engine config {resp.status}")
        await resp.read()


async def loadgen(spec: dict[str, Any]) -> dict[str, Any]:
    """The load of one spec: ``mode`` ttfb or stream (streaming requests), plain (non-streaming)
    or paced, against ``url``; the counts and samples for the orchestrator."""
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
        tally = Tally()  # forget the warm-up's counts (``one`` counts into this one from now on)

        count = int(spec.get("count", 10_000_000))
        duration = float(spec.get("duration", 3600))
        _mark("START")
        t0 = time.perf_counter()
        await _workers(concurrency, t0 + duration, count, one, tally)
        wall = time.perf_counter() - t0
        _mark("END")
        return {
            "ok": tally.ok,
            "errors": tally.errors,
            "first_error": tally.first_error,
            "wall": wall,
            "events": tally.events,
            "ttfb": tally.ttfb,
        }


async def _paced(
    session: aiohttp.ClientSession, spec: dict[str, Any], url: str, headers: dict[str, str]
) -> dict[str, Any]:
    """``streams`` concurrent streams with the engine's chunk delay set to ``delay``: how many
    complete before ``deadline``, and their latencies."""
    import aiohttp

    n = int(spec["streams"])
    engine = spec["engine"]
    plain = json.dumps(chat_body(False)).encode()
    streamed = json.dumps(chat_body(True)).encode()
    await _set_engine(session, engine, chunk_delay=0)
    try:
        # Warm-up (untimed): n concurrent quick requests leave up to n keep-alive connections in
        # the client's pool (and the proxy's upstream pool), so the timed part opens none.
        warm = await asyncio.wait_for(
            asyncio.gather(*(_plain_once(session, url, plain, headers) for _ in range(n)), return_exceptions=True), 60
        )
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
        _, pending = await asyncio.wait(tasks, timeout=float(spec.get("deadline", PACED_DEADLINE)))
        wall = time.perf_counter() - t0
        _mark("END")
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        with contextlib.suppress(Exception):
            async with aiohttp.ClientSession() as fresh:  # the pool may be busy with cancelled streams
                await _set_engine(fresh, engine, chunk_delay=0)
    return {
        "streams": n,
        "ok": tally.ok,
        "errors": tally.errors,
        "first_error": tally.first_error,
        "unfinished": len(pending),
        "wall": wall,
        "warm_errors": len(warm_errors),
        "ttfb_p50": pct(ttfb, 50),
        "ttfb_p99": pct(ttfb, 99),
        "duration_p50": pct(durations, 50),
        "duration_p99": pct(durations, 99),
        "last_done": max(durations, default=math.nan),
        "gap_p50": pct(gaps, 50),
        "gap_p99": pct(gaps, 99),
        "gap_max": max(gaps, default=math.nan),
        "gaps": len(gaps),
    }


def loadgen_main(raw: str) -> int:
    """The load-generator process: runs the JSON spec ``raw`` and prints the markers."""
    spec = json.loads(raw)
    with contextlib.suppress(ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
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


@dataclass
class Run:
    result: dict[str, Any]  # the load generator's RESULT
    cpu_s: float  # proxy CPU seconds in the timed window
    engine_cpu_s: float
    peak_rss_kib: int


def run_load(setup: Setup, target: str, spec: dict[str, Any], timeout: float) -> Run:
    """One load-generator process; the proxy is measured between its START and END markers."""
    spec = {**spec, "url": setup.urls[target], "engine": setup.engine}
    argv = [sys.executable, str(ENTRY), "--loadgen", json.dumps(spec)]
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
    peak = 0
    result: dict[str, Any] | None = None
    deadline = time.monotonic() + timeout
    profiler: subprocess.Popen[bytes] | None = None
    profile: list[str] | None = None  # py-spy's command line, when the gateway is profiled in this run
    if setup.pyspy and target == "gateway" and spec["mode"] in ("stream", "plain") and setup.profile_dir:
        setup.profile_dir.mkdir(parents=True, exist_ok=True)
        suffix = "svg" if setup.pyspy_format == "flamegraph" else "txt"
        out = setup.profile_dir / f"gateway-{spec['mode']}-{time.strftime('%H%M%S')}.{suffix}"
        profile = [
            setup.pyspy,
            "record",
            "--nonblocking",
            "-r",
            "100",
            "-f",
            setup.pyspy_format,
            "-o",
            str(out),
            "-d",
            str(max(1, int(spec.get("duration", 5)))),
            "-p",
            str(pids[0]),
        ]
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
                if profile is not None:
                    profiler = subprocess.Popen(
                        profile, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                cpu0, eng0 = cpu_seconds(pids), cpu_seconds(engine)
                sampler = RssSampler(pids)
                sampler.start()
            elif line == "END":
                cpu1, eng1 = cpu_seconds(pids), cpu_seconds(engine)
                peak = sampler.stop() if sampler else 0
                sampler = None
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
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
        raise RuntimeError(
            f"load generator for {target} failed: {result and result.get('error')} (exit {proc.returncode})"
        )
    return Run(result, cpu1 - cpu0, eng1 - eng0, peak)
