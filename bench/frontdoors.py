#!/usr/bin/env python3
"""dgxmm's gateway under different front servers, against nginx, in one run of alternating rounds.

    .venv/bin/python bench/frontdoors.py [--rounds N] [--rsgi] [--floor] [--python BIN]
                                         [--rust-tasks] [--json FILE]

Targets, each on 127.0.0.1 and started as bench/gateway.py starts them (servers.py): the engine
alone ("direct"), nginx in front of it, and the same dgxmm config (one on-demand deployment of
the test engine, started by a first request) served by

* ``uvicorn``: ``dgxmm serve``, dgxmm's own front door (uvicorn with dgxmm's protocol);
* ``granian-asgi``: granian's ASGI interface (bench/granian_serve.py; needs
  ``.venv/bin/pip install -e '.[frontdoors]'``), one worker process, one Rust runtime thread;
* ``granian-rsgi`` (``--rsgi``): granian's RSGI interface through bench/rsgi_front.py;
* ``uvicorn-floor`` (``--floor``): ``dgxmm serve`` with the gateway's checks and bookkeeping cut
  out of a ready deployment's requests (bench/floor_serve.py): what the stack itself costs;
* ``uvicorn-pyX.Y`` (``--python BIN``): ``dgxmm serve`` under another interpreter (a venv of
  its own with dgxmm installed, e.g. Python 3.13);
* ``granian-asgi-rust`` (``--rust-tasks``): ASGI with granian's Rust task implementation (fails
  on 2.8.9: anyio's ``all_tasks()`` cannot read granian's Rust tasks, FastAPI's thread pool
  raises "Future object is not initialized").

Each dgxmm has its own engine (the same command); nginx points at the uvicorn dgxmm's engine.
Every round runs, for every target in a rotated order: TTFB of streaming requests at c=1 and
c=64, streaming at c=16 and non-streaming at c=16 (the load generator of load.py). A proxy's CPU
is its whole process tree's (all threads of the granian server process and its worker; never
the engine's), read around each timed window. The table gives the median of the rounds and the
median of the per-round ratios to nginx and to uvicorn, so a shared machine's drift cancels;
below it, the CPU per request split by process and thread (granian: its event loop's thread
against its Rust runtime thread), over whole load runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from load import run_load
from procfs import descendants, thread_cpu
from report import median
from scenario import ROOT
from servers import Children, Setup, log, start_dgxmm, start_nginx

GRANIAN = [sys.executable, str(ROOT / "bench" / "granian_serve.py")]
PHASES: dict[str, dict[str, Any]] = {
    "ttfb1": {"mode": "ttfb", "concurrency": 1, "count": 300},
    "ttfb64": {"mode": "ttfb", "concurrency": 64, "duration": 1.5},
    "stream": {"mode": "stream", "concurrency": 16, "duration": 2},
    "plain": {"mode": "plain", "concurrency": 16, "duration": 2},
}


def start(setup: Setup, variants: dict[str, list[str]]) -> dict[str, str]:
    """The dgxmm of every variant (uvicorn's first: nginx uses its engine) and nginx; the
    engines' base URLs by target."""
    engines: dict[str, str] = {}
    for name, launcher in variants.items():
        proc, url, engine, engine_pid = start_dgxmm(setup, name, launcher or None)
        if name == "uvicorn":
            setup.engine, setup.engine_pid = engine, engine_pid
            _, ng_base, ng_pids = start_nginx(setup)
            setup.urls["nginx"] = f"{ng_base}/v1/chat/completions"
            setup.pids["nginx"] = ng_pids
            setup.urls["direct"] = f"{engine}/v1/chat/completions"
            setup.pids["direct"] = []
        setup.urls[name] = url
        setup.pids[name] = [proc.pid, *(p for p in descendants(proc.pid) if p != engine_pid)]
        engines[name] = engine
        log(f"{name}: processes {setup.pids[name]} (engine {engine_pid} not counted)")
    return engines


def measure(setup: Setup, targets: list[str], engines: dict[str, str], rounds: int) -> dict[str, Any]:
    """Per target and metric, one value per round."""
    found: dict[str, dict[str, list[float]]] = {t: {} for t in targets}
    loads: list[float] = []
    threads: dict[str, dict[str, float]] = {}  # per "phase target": CPU seconds per thread role, and requests
    for r in range(rounds):
        loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
        for phase, spec in PHASES.items():
            order = targets[r % len(targets) :] + targets[: r % len(targets)]
            for target in order:
                pids = setup.pids[target]
                before = thread_cpu(pids)
                run = run_load(setup, target, spec, 600)
                res = run.result
                if pids and phase in ("plain", "stream"):
                    per = threads.setdefault(f"{phase} {target}", {"requests": 0.0})
                    per["requests"] += res["ok"]
                    for key, seconds in thread_cpu(pids).items():
                        pid, name = key.split("/", 1)
                        role = f"{'server' if int(pid) == pids[0] else 'worker'} {name}"
                        per[role] = per.get(role, 0.0) + seconds - before.get(key, 0.0)
                if res["errors"]:
                    log(f"{phase} {target}: {res['errors']} errors ({res['first_error']})")
                values: dict[str, float] = {}
                if spec["mode"] == "ttfb":
                    values[f"{phase}_p50_ms"] = median(res["ttfb"]) * 1e3
                elif phase == "stream":
                    values["chunks_s"] = res["events"] / res["wall"]
                    values["stream_cpu_us"] = 1e6 * run.cpu_s / max(1, res["ok"])
                else:
                    values["req_s"] = res["ok"] / res["wall"]
                    values["plain_cpu_us"] = 1e6 * run.cpu_s / max(1, res["ok"])
                for key, value in values.items():
                    found[target].setdefault(key, []).append(value)
                log(f"round {r + 1}/{rounds} {phase} {target}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
                for engine in set(engines.values()):
                    with contextlib.suppress(Exception):
                        httpx.delete(f"{engine}/_test/requests", timeout=30)
    loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
    return {"values": found, "loadavg": loads, "threads": threads}


ROWS = [
    ("plain_cpu_us", "proxy CPU us per non-streaming request, c=16", 0),
    ("req_s", "non-streaming req/s, c=16", 0),
    ("stream_cpu_us", "proxy CPU us per stream (51 chunks), c=16", 0),
    ("chunks_s", "streaming chunks/s, c=16", 0),
    ("ttfb1_p50_ms", "TTFB p50, c=1 (ms)", 2),
    ("ttfb1_added", "  added vs direct (ms)", 2),
    ("ttfb64_p50_ms", "TTFB p50, c=64 (ms)", 1),
    ("ttfb64_added", "  added vs direct (ms)", 1),
]


def table(values: dict[str, dict[str, list[float]]], targets: list[str]) -> str:
    """Medians of rounds; for each dgxmm variant the median per-round ratio to nginx and to uvicorn."""
    for t in targets:
        for phase in ("ttfb1", "ttfb64"):
            direct = values["direct"][f"{phase}_p50_ms"]
            values[t][f"{phase}_added"] = [a - b for a, b in zip(values[t][f"{phase}_p50_ms"], direct, strict=True)]
    shown = [t for t in targets if t != "direct"]
    head = (
        "| metric | direct | "
        + " | ".join(shown)
        + " | "
        + " | ".join(f"{t} x nginx | {t} x uvicorn" for t in shown if t not in ("nginx", "uvicorn"))
        + " | uvicorn x nginx |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for key, label, digits in ROWS:
        cells = []
        for t in ["direct", *shown]:
            series = values[t].get(key)
            cells.append(f"{median(series):,.{digits}f}" if series and not (t == "direct" and "cpu" in key) else "-")
        ratios = []
        for t in [*(t for t in shown if t not in ("nginx", "uvicorn")), "uvicorn"]:
            for base in ("nginx", "uvicorn") if t != "uvicorn" else ("nginx",):
                if "added" in key:
                    ratios.append("-")
                    continue
                per = [a / b for a, b in zip(values[t][key], values[base][key], strict=True) if b]
                ratios.append(f"{median(per):.2f}x" if per else "-")
        lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rsgi", action="store_true", help="also granian's RSGI interface (bench/rsgi_front.py)")
    parser.add_argument("--rust-tasks", action="store_true", help="also granian ASGI with --task-impl rust")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also dgxmm serve with the gateway's own work cut out (bench/floor_serve.py)",
    )
    parser.add_argument(
        "--python",
        type=Path,
        metavar="BIN",
        help="also dgxmm serve under this interpreter (a venv with dgxmm installed)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    variants: dict[str, list[str]] = {"uvicorn": [], "granian-asgi": [*GRANIAN, "--interface", "asgi"]}
    if args.rsgi:
        variants["granian-rsgi"] = [*GRANIAN, "--interface", "rsgi"]
    if args.floor:
        variants["uvicorn-floor"] = [sys.executable, str(ROOT / "bench" / "floor_serve.py"), "serve"]
    if args.python:
        version = subprocess.run(
            [str(args.python), "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        variants[f"uvicorn-py{version}"] = [str(args.python), "-m", "dgxmm.cli", "serve"]
    if args.rust_tasks:
        variants["granian-asgi-rust"] = [*GRANIAN, "--interface", "asgi", "--task-impl", "rust"]

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    children = Children()
    tmp = Path(tempfile.mkdtemp(prefix="dgxmm-frontdoors-"))
    started = time.time()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    try:
        setup = Setup(tmp, children)
        engines = start(setup, variants)
        targets = ["direct", "nginx", *variants]
        result = measure(setup, targets, engines, args.rounds)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            children.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    from importlib import metadata

    versions = ", ".join(f"{d} {metadata.version(d)}" for d in ("granian", "uvicorn", "uvloop", "httptools"))
    load_after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(
        f"# dgxmm front servers, {time.strftime('%Y-%m-%d %H:%M %Z')}, {args.rounds} rounds,"
        f" {time.time() - started:.0f} s"
    )
    print(
        f"load average {' '.join(load_before)} before, {load_after} after; 1-min load at each round's start:"
        f" {', '.join(f'{x:.1f}' for x in result['loadavg'])}; {versions}"
    )
    print()
    print(table(result["values"], targets))
    print()
    print("CPU us per request by thread (whole load runs, warm-up included; all rounds):")
    for what, per in result["threads"].items():
        n = max(1.0, per.pop("requests"))
        print(f"  {what}: " + ", ".join(f"{role} {1e6 * sec / n:.0f}" for role, sec in sorted(per.items()) if sec > 0))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
