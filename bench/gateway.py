#!/usr/bin/env python3
"""Benchmark of dgxmm's on-demand gateway against nginx and a direct connection, in one run.

    .venv/bin/python bench/gateway.py [--quick] [--json FILE] [--upstream-max-connections N]
                                      [--py-spy BIN [--profile-dir DIR]] [--check]

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
   sampled every 50 ms) and CPU seconds (utime+stime);
5. the cost of the gateway's per-request instrumentation (metrics, activity, access line),
   measured in-process after the servers stopped (bench/instrumentation.py), where microseconds
   do not drown in noise. ``--baseline-src DIR`` also runs a second dgxmm from another
   checkout's ``src`` (say main's; "bare", its own engine) against this one in alternating
   rounds first: CPU per request and TTFB of each, and the median of per-round differences.

Phases 1 to 3 run in rounds (6 for TTFB, 9 for throughput, 2-3 s each); within a round the three
targets run back to back, and each ratio is the median of the per-round ratios, so slow drifts of
a shared machine's speed cancel out. The proxy's CPU time is also read around every timed window
(the load generator prints START and END markers), giving CPU per request. The result is one
markdown table with ratios to direct and to nginx, and the targets (streaming >= 0.8x nginx
chunks/s, added TTFB p50 <= 1 ms at c=1 and <= 3 ms at c=64, CPU per non-streaming request <= 100 us,
all paced streams complete) with whether each is met. ``--check`` exits 1 only when a figure is
off by far (streaming below 0.4x nginx, added TTFB at c=1 above 5 ms, more than 400 us of CPU per
non-streaming request and more than 8x nginx's, a paced stream lost): the quick run in CI, never
flaky on a busy or slow machine.

Every process started here is stopped at the end, also on errors, SIGTERM and Ctrl-C; every loop
is bounded in count and time. ``--upstream-max-connections`` sets dgxmm's pool size (the
default 256 makes 1000 streams queue in waves); ``--py-spy`` records the gateway's stacks during
phases 2 and 3 (this perturbs the numbers). ``--quick`` shrinks everything so the whole run takes
about a minute (a smoke run); the full run takes a few minutes.

This file is the entry point: the command line, the phases and the targets. Beside it:
scenario.py (what all processes agree on), servers.py (dgxmm, the engine and nginx), load.py
(the load-generator process and the measurements around it), procfs.py (/proc readings) and
report.py (statistics and the table). They are imported from this directory, so the benchmark
runs as a plain script with nothing to install.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from instrumentation import measure as measure_in_process
from load import Run, loadgen_main, run_load
from report import instrumentation_table, instrumentation_target, median, pct, round_ratio, table
from scenario import EVENTS_PER_STREAM, PACED_DEADLINE, PACED_DELAY, PACED_RAMP, TARGETS
from servers import Children, Setup, clear_engine_records, log, reset_engine, start_servers


@dataclass
class Profile:
    """How long each phase runs: a full run for numbers, a quick one as a smoke test."""

    rounds: int  # rounds of the TTFB phases
    throughput_rounds: int  # rounds of the chunks/s and req/s phases
    ttfb1_count: int  # requests per target and round at c=1
    ttfb64_s: float  # seconds per target and round at c=64
    stream_s: float
    plain_s: float
    paced_streams: int


FULL = Profile(rounds=6, throughput_rounds=9, ttfb1_count=500, ttfb64_s=2, stream_s=2, plain_s=2, paced_streams=1000)
QUICK = Profile(rounds=1, throughput_rounds=1, ttfb1_count=200, ttfb64_s=1.5, stream_s=2, plain_s=2, paced_streams=1000)


def measure_instrumentation(setup: Setup, profile: Profile) -> dict[str, dict[str, list[float]]]:
    """Phase 5 (``--baseline-src``): the gateway and the baseline dgxmm in alternating rounds: CPU us per request at c=16
    (non-streaming, streaming), streaming chunks/s at c=16, and the TTFB p50 in ms at c=1. It runs
    first, while both processes have served only their warm-up request: after the paced phase the
    gateway's process holds more memory, and its garbage collector alone would cost more."""
    log("phase 5 (run first): gateway against the second dgxmm (bare)")
    found: dict[str, dict[str, list[float]]] = {
        name: {"gateway": [], "bare": []} for name in ("plain", "stream", "stream_rate", "ttfb")
    }
    specs = (
        ("plain", {"mode": "plain", "concurrency": 16, "duration": profile.plain_s}),
        ("stream", {"mode": "stream", "concurrency": 16, "duration": profile.stream_s}),
        ("ttfb", {"mode": "ttfb", "concurrency": 1, "count": profile.ttfb1_count}),
    )
    for name, spec in specs:
        for r in range(profile.throughput_rounds):
            for target in ("gateway", "bare") if r % 2 == 0 else ("bare", "gateway"):
                run = run_load(setup, target, spec, 600)
                res = run.result
                values = (
                    {"ttfb": pct(res["ttfb"], 50) * 1e3}
                    if name == "ttfb"
                    else {name: 1e6 * run.cpu_s / max(1, res["ok"])}
                )
                if name == "stream":
                    values["stream_rate"] = res["events"] / res["wall"]
                log(
                    f"phase 5 {name} round {r + 1}/{profile.throughput_rounds} {target}: {res['ok']} ok,"
                    f" {res['errors']} errors, " + ", ".join(f"{k} {v:.2f}" for k, v in values.items())
                )
                for key, value in values.items():
                    found[key][target].append(value)
                clear_engine_records(setup)
    return found


def measure(setup: Setup, profile: Profile) -> dict[str, Any]:
    """Phases 1 to 4 against every target; per target and phase, the numbers of the report."""
    results: dict[str, Any] = {t: {} for t in TARGETS}

    def rounds(name: str, spec: dict[str, Any], timeout: float, count: int) -> dict[str, list[Run]]:
        runs: dict[str, list[Run]] = {t: [] for t in TARGETS}
        for r in range(count):
            order = TARGETS[r % 3 :] + TARGETS[: r % 3]
            for target in order:
                run = run_load(setup, target, spec, timeout)
                res = run.result
                log(
                    f"{name} round {r + 1}/{count} {target}: {res['ok']} ok, {res['errors']} errors"
                    f" in {res['wall']:.1f} s" + (f" ({res['first_error']})" if res["first_error"] else "")
                )
                runs[target].append(run)
                clear_engine_records(setup)
        return runs

    def ttfb(name: str, runs: dict[str, list[Run]]) -> None:
        for target, rs in runs.items():
            samples = [x for run in rs for x in run.result["ttfb"]]
            requests = sum(run.result["ok"] for run in rs)
            results[target][name] = {
                "p50_ms": pct(samples, 50) * 1e3,
                "p99_ms": pct(samples, 99) * 1e3,
                "n": len(samples),
                "errors": sum(run.result["errors"] for run in rs),
                "req_s": requests / max(1e-9, sum(run.result["wall"] for run in rs)),
                "cpu_us_per_req": 1e6 * sum(run.cpu_s for run in rs) / max(1, requests),
            }

    log("phase 1a: TTFB at c=1")
    ttfb(
        "ttfb_c1",
        rounds(
            "ttfb c=1",
            {"mode": "ttfb", "concurrency": 1, "count": profile.ttfb1_count},
            300 + profile.ttfb1_count * 0.2,
            profile.rounds,
        ),
    )
    log("phase 1b: TTFB at c=64")
    ttfb(
        "ttfb_c64",
        rounds(
            "ttfb c=64",
            {"mode": "ttfb", "concurrency": 64, "duration": profile.ttfb64_s},
            300 + profile.ttfb64_s,
            profile.rounds,
        ),
    )

    log("phase 2: streaming chunks/s at c=16")
    runs = rounds(
        "stream c=16",
        {"mode": "stream", "concurrency": 16, "duration": profile.stream_s},
        300 + profile.stream_s,
        profile.throughput_rounds,
    )
    for target, rs in runs.items():
        rates = [run.result["events"] / run.result["wall"] for run in rs]
        requests = sum(run.result["ok"] for run in rs)
        events = sum(run.result["events"] for run in rs)
        results[target]["stream_c16"] = {
            "chunks_s": median(rates),
            "rounds": rates,
            "errors": sum(run.result["errors"] for run in rs),
            "cpu_us_per_req": 1e6 * sum(run.cpu_s for run in rs) / max(1, requests),
            "cpu_us_per_chunk": 1e6 * sum(run.cpu_s for run in rs) / max(1, events),
            "engine_cpu_us_per_chunk": 1e6 * sum(run.engine_cpu_s for run in rs) / max(1, events),
        }

    log("phase 3: non-streaming req/s at c=16")
    runs = rounds(
        "plain c=16",
        {"mode": "plain", "concurrency": 16, "duration": profile.plain_s},
        300 + profile.plain_s,
        profile.throughput_rounds,
    )
    for target, rs in runs.items():
        rates = [run.result["ok"] / run.result["wall"] for run in rs]
        requests = sum(run.result["ok"] for run in rs)
        results[target]["plain_c16"] = {
            "req_s": median(rates),
            "rounds": rates,
            "errors": sum(run.result["errors"] for run in rs),
            "cpu_us_per_req": 1e6 * sum(run.cpu_s for run in rs) / max(1, requests),
        }

    n = profile.paced_streams
    log(f"phase 4: {n} concurrent paced streams ({PACED_DELAY * 1e3:g} ms per chunk)")
    for target in TARGETS:
        try:
            run = run_load(
                setup,
                target,
                {
                    "mode": "paced",
                    "streams": n,
                    "delay": PACED_DELAY,
                    "ramp": PACED_RAMP,
                    "deadline": PACED_DEADLINE,
                    "request_timeout": None,
                },
                PACED_DEADLINE + 200,
            )
        finally:
            reset_engine(setup)
        res = run.result
        log(
            f"paced {target}: {res['ok']}/{n} complete, {res['errors']} errors, {res['unfinished']} unfinished,"
            f" last done after {res['last_done']:.1f} s" + (f" ({res['first_error']})" if res["first_error"] else "")
        )
        results[target]["paced"] = {
            **res,
            "cpu_s": run.cpu_s,
            "engine_cpu_s": run.engine_cpu_s,
            "peak_rss_mib": run.peak_rss_kib / 1024,
        }
        clear_engine_records(setup)
        time.sleep(1)

    return results


def check_targets(results: dict[str, Any], paced_streams: int) -> list[tuple[str, bool, str]]:
    """The gateway's performance targets: (what, whether met, the measured value)."""
    d, n, g = (results[t] for t in TARGETS)
    ratio = round_ratio(g["stream_c16"]["rounds"], n["stream_c16"]["rounds"])
    added = g["ttfb_c1"]["p50_ms"] - d["ttfb_c1"]["p50_ms"]
    added64 = g["ttfb_c64"]["p50_ms"] - d["ttfb_c64"]["p50_ms"]
    cpu = g["plain_c16"]["cpu_us_per_req"]
    done = g["paced"]["ok"]
    return [
        ("gateway streaming chunks/s >= 0.8x nginx (c=16)", ratio >= 0.8, f"{ratio:.2f}x nginx"),
        ("gateway added TTFB p50 <= 1 ms (c=1)", added <= 1.0, f"{added:+.2f} ms"),
        ("gateway added TTFB p50 <= 3 ms (c=64)", added64 <= 3.0, f"{added64:+.2f} ms"),
        ("gateway CPU per non-streaming request <= 100 us (c=16)", cpu <= 100, f"{cpu:.0f} us"),
        (
            f"gateway: all {paced_streams} paced streams complete within {PACED_DEADLINE:g} s",
            done == paced_streams,
            f"{done}/{paced_streams}",
        ),
    ]


def far_off(results: dict[str, Any], paced_streams: int) -> list[str]:
    """Figures off by far from the targets (``--check``, the quick run in CI): a loaded machine
    misses a target now and then, never these."""
    d, n, g = (results[t] for t in TARGETS)
    ratio = round_ratio(g["stream_c16"]["rounds"], n["stream_c16"]["rounds"])
    added = g["ttfb_c1"]["p50_ms"] - d["ttfb_c1"]["p50_ms"]
    cpu = g["plain_c16"]["cpu_us_per_req"]
    # A slow machine makes every process slower: past 400 us only when also past 8x nginx's own.
    cpu_limit = max(400.0, 8 * n["plain_c16"]["cpu_us_per_req"])
    bad = []
    if not ratio >= 0.4:
        bad.append(f"streaming chunks/s {ratio:.2f}x nginx (< 0.4x)")
    if not added <= 5.0:
        bad.append(f"added TTFB p50 at c=1 {added:+.2f} ms (> 5 ms)")
    if not cpu <= cpu_limit:
        bad.append(f"CPU per non-streaming request {cpu:.0f} us (> {cpu_limit:.0f} us: 400, or 8x nginx's)")
    if g["paced"]["ok"] != paced_streams:
        bad.append(f"{g['paced']['ok']}/{paced_streams} paced streams complete")
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: shorter phases, about a minute")
    parser.add_argument(
        "--instrumentation-only",
        action="store_true",
        help="only phase 5 and the in-process figures (the instrumentation's cost; with --baseline-src)",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        metavar="DIR",
        help="phase 5: a second dgxmm runs this src directory's code (another checkout)",
    )
    parser.add_argument("--json", type=Path, help="also write all numbers to this file")
    parser.add_argument(
        "--upstream-max-connections",
        type=int,
        metavar="N",
        help="set dgxmm's [ondemand] upstream_max_connections (default: dgxmm's, 256)",
    )
    parser.add_argument(
        "--py-spy",
        metavar="BIN",
        help="profile the gateway with this py-spy binary during "
        "phases 2 and 3 (raw stacks in --profile-dir); perturbs the numbers",
    )
    parser.add_argument("--profile-dir", type=Path, default=Path("/tmp/dgxmm-bench-profiles"))
    parser.add_argument(
        "--py-spy-format",
        choices=("raw", "flamegraph"),
        default="raw",
        help="raw collapsed stacks (to count shares) or an SVG flame graph",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a figure is off by far (CI)")
    parser.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loadgen:
        return loadgen_main(args.loadgen)
    if args.instrumentation_only and args.baseline_src is None:
        parser.error("--instrumentation-only compares with another checkout: give --baseline-src DIR")

    profile = QUICK if args.quick else FULL
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard == resource.RLIM_INFINITY else max(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # inherited by dgxmm, its engine, nginx
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 4 * profile.paced_streams + 256:
        log(
            f"warning: RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} is low for "
            f"{profile.paced_streams} streams"
        )

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    children = Children()
    tmp = Path(tempfile.mkdtemp(prefix="dgxmm-bench-"))
    started = time.time()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    try:
        setup = Setup(
            tmp,
            children,
            upstream_max=args.upstream_max_connections,
            pyspy=args.py_spy,
            pyspy_format=args.py_spy_format,
            profile_dir=args.profile_dir,
            baseline_src=args.baseline_src,
        )
        start_servers(setup)
        instrumentation = measure_instrumentation(setup, profile) if args.baseline_src else None
        results = {} if args.instrumentation_only else measure(setup, profile)
        if instrumentation is not None:
            results["instrumentation"] = instrumentation
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            children.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    log("instrumentation in-process (the servers are stopped)")
    in_process = measure_in_process()
    only = args.instrumentation_only
    report = "" if only else table(results, profile.paced_streams, setup.idle_rss_kib)
    targets = [] if only else check_targets(results, profile.paced_streams)
    targets.append(instrumentation_target(results, in_process))
    bad = [] if only else far_off(results, profile.paced_streams)

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    versions = ", ".join(f"{k} {v}" for k, v in setup.versions.items())
    print()
    print(
        f"# dgxmm gateway benchmark, {time.strftime('%Y-%m-%d %H:%M %Z')} ({'quick' if args.quick else 'full'} run,"
        f" {time.time() - started:.0f} s)"
    )
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"machine: {os.cpu_count()} cores ({cpu}); load average {' '.join(load_before)} before,"
        f" {' '.join(load_after)} after; {versions}"
    )
    print(
        f"engine: tests/engines/testengine.py, {EVENTS_PER_STREAM} SSE events per stream; "
        f"{profile.rounds} rounds per TTFB phase, {profile.throughput_rounds} per throughput phase (order"
        f" rotated; throughput: median of rounds, ratios: median of"
        f" per-round ratios; latency: percentiles of all rounds' samples); nginx: 1 worker; dgxmm: 1 process,"
        f" upstream_max_connections = {setup.upstream_max or 'default (256)'}; paced streams start over"
        f" {PACED_RAMP:g} s"
    )
    if report:
        print()
        print(report)
    print()
    print("Instrumentation (metrics and access log) of a gateway request:")
    print()
    print(instrumentation_table(results, in_process))
    print()
    print("Targets:")
    for label, ok, value in targets:
        print(f"  [{'MET' if ok else 'MISSED'}] {label}: {value}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "quick": args.quick,
                    "cores": os.cpu_count(),
                    "cpu": cpu,
                    "versions": setup.versions,
                    "results": _strip(results),
                    "in_process": in_process,
                    "targets": [{"target": t, "met": ok, "value": v} for t, ok, v in targets],
                    "table": report,
                },
                indent=1,
            )
        )
    for line in bad:
        print(f"OFF BY FAR: {line}")
    return 1 if args.check and bad else 0


def _strip(results: dict[str, Any]) -> dict[str, Any]:
    """The results without raw sample lists (kept small for --json)."""
    return {
        t: {k: {kk: vv for kk, vv in v.items() if kk != "ttfb"} if isinstance(v, dict) else v for k, v in r.items()}
        for t, r in results.items()
    }


if __name__ == "__main__":
    sys.exit(main())
