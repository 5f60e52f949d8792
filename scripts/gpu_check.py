"""``make gpu-check``: what dgxmm does with a real vLLM on this host's GPU, in one table (issue 52).

It runs ``dgxmm serve`` of the installed dgxmm in a temporary data directory, makes one on-demand
vLLM deployment of ``--model`` (a local path downloads nothing), and through dgxmm's own API and
router measures:

- the first cold start (a chat by name to the stopped model, timed at the client), the second
  (the compile cache kept, as vLLM's own log says) and one after the cache was cleared; beside
  each, the engine's own time to serve as dgxmm's start saw it ("Ready after N s") and what dgxmm
  added over it and over a warm request;
- sleep and wake at each level dgxmm offers, with the memory each freed as the host counts it:
  NVML's used memory of the devices the engine was placed on, or, where NVML has no memory figure
  (unified memory: a DGX Spark's GB10), ``/proc/meminfo``'s MemTotal less MemAvailable;
- the placement: the devices dgxmm placed the engine on and the ``CUDA_VISIBLE_DEVICES`` the
  engine's own process got (read from ``/proc/PID/environ``).

``--dry-run`` (``make gpu-check DRY_RUN=1``) runs the same steps here against the suite's vLLM
stand-in (tests/engines/fakevllm: vLLM's command line and compile-cache lines in front of the test
engine) and prints the same columns: it proves the script and dgxmm's side of each step, never a
GPU's figures. Nothing here needs the test tree otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "engines" / "fakevllm"
MARKER = b"DGXMM_DEPLOYMENT_ID="
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
READY = re.compile(r"Ready after ([0-9.]+) s")
# vLLM's own words for a compile-cache hit and a miss (vllm/compilation/backends.py; the stand-in
# says the same).
CACHE_HIT = "Directly load the compiled graph"
CACHE_MISS = re.compile(r"Compiling a graph for (dynamic shape|compile range)")
SLEEP_LEVELS = (1,)  # what dgxmm's sleep offers today (docs/engines.md); a level per row


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"gpu-check: {what} not reached within {timeout:g} s")
        time.sleep(0.1)
    return result


class Memory:
    """The host's own count of used memory: NVML per device, else /proc/meminfo (unified memory)."""

    def __init__(self, source: str) -> None:
        self.source = source
        if source == "nvml":
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml

    @staticmethod
    def choose() -> str:
        """NVML where it reports device memory; ``meminfo`` where it does not or is absent."""
        try:
            import pynvml
        except ImportError:
            return "meminfo"
        try:
            pynvml.nvmlInit()
            try:
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
            finally:
                pynvml.nvmlShutdown()
        except pynvml.NVMLError:  # no driver, no device, or no memory figure (a GB10): the host's count
            return "meminfo"
        return "nvml"

    def used_gib(self, devices: list[int] | None) -> float:
        if self.source == "nvml":
            count = self._nvml.nvmlDeviceGetCount()
            chosen = devices if devices else list(range(count))
            used = sum(
                self._nvml.nvmlDeviceGetMemoryInfo(self._nvml.nvmlDeviceGetHandleByIndex(i)).used for i in chosen
            )
            return float(used) / 1024**3
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        kib = int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])
        return kib / 1024**2


class Dgxmm:
    """``dgxmm serve`` in a temporary directory, reached through its admin API and its router."""

    def __init__(self, work: Path, args: argparse.Namespace, source: str) -> None:
        self.work, self.port, self.key = work, free_port(), secrets.token_urlsafe(24)
        (work / "caller.key").write_text(self.key + "\n")
        # The dry run declares two devices, so that placement and CUDA_VISIBLE_DEVICES are shown.
        dry = {"source": "declared", "devices_gib": [2 * args.memory_gib, 2 * args.memory_gib]}
        memory = dry if source == "dry" else {"source": source}
        config = {
            "server": {"port": self.port, "data_dir": str(work / "data")},
            "memory": memory,
            "engines": {"vllm_python": args.vllm_python},
            "deployer": {"start_timeout_s": args.start_timeout_s},
            "ondemand": {"key_file": str(work / "caller.key"), "allowed_cidrs": ["127.0.0.1/32"]},
            "runtime": {"engines_outlive_dgxmm": False},
        }
        lines = [
            f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in kv.items()) for name, kv in config.items()
        ]
        (work / "dgxmm.toml").write_text("".join(lines))
        self.log = work / "dgxmm.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dgxmm.cli", "serve", "--config", str(work / "dgxmm.toml")],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{self.port}/dgxmm/api", timeout=60)
        wait_for(self._up, 60, f"dgxmm serve answering (its log: {self.log})")
        token = (work / "data" / "admin-token").read_text().strip()
        self.api.headers["Authorization"] = f"Bearer {token}"
        self.router = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}/v1",
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=args.start_timeout_s + 60,
        )

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise SystemExit(f"gpu-check: dgxmm serve exited: {self.log.read_text()[-2000:]}")
        try:
            return self.api.get("/openapi.json").status_code == 200
        except httpx.TransportError:
            return False

    def call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.api.request(method, path, **kw)
        if resp.status_code >= 400:
            raise SystemExit(f"gpu-check: {method} {path}: {resp.status_code} {resp.text}")
        return resp.json() if resp.content else None

    def chat(self, name: str) -> float:
        began = time.perf_counter()
        resp = self.router.post("/chat/completions", json={**CHAT, "model": name})
        if resp.status_code != 200:
            raise SystemExit(f"gpu-check: a chat with {name}: {resp.status_code} {resp.text}")
        return time.perf_counter() - began

    def state(self, dep_id: str, *states: str, timeout: float) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (v := self.call("GET", f"/deployments/{dep_id}"))["state"] in states and v, timeout, f"{states}"
            )
        )

    def ready_s(self, dep_id: str, starts: int) -> float:
        """The engine's time to serve as dgxmm's start saw it, of the deployment's start number
        ``starts``: its "Ready after N s" (the event log is written a moment after the start)."""

        def readies() -> list[float] | None:
            events = self.call("GET", "/events/history", params={"deployment_id": dep_id, "limit": 500})
            ordered = sorted(events, key=lambda e: float(e["time"]))
            found = [float(m.group(1)) for e in ordered if (m := READY.search(str(e["text"])))]
            return found if len(found) >= starts else None

        return float(wait_for(readies, 30, f"start {starts}'s ready event")[starts - 1])

    def run_lines(self, dep_id: str) -> list[str]:
        """The engine log of its latest run (dgxmm writes a line at each start)."""
        lines: list[str] = self.call("GET", f"/deployments/{dep_id}/logs", params={"tail": 5000})["lines"]
        starts = [i for i, line in enumerate(lines) if line.startswith("--- dgxmm: starting")]
        return lines[starts[-1] :] if starts else lines

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def engine_env(dep_id: str) -> dict[str, str]:
    """The environment of the deployment's engine process (the process runtime marks it)."""
    marker = MARKER + dep_id.encode()
    for environ in sorted(Path("/proc").glob("[0-9]*/environ")):
        try:
            items = environ.read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in items:
            return dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)
    return {}


def cache_said(lines: list[str]) -> str:
    hit = any(CACHE_HIT in line for line in lines)
    miss = any(CACHE_MISS.search(line) for line in lines)
    return "loaded" if hit and not miss else "compiled" if miss else "not said"


def check(args: argparse.Namespace) -> list[dict[str, Any]]:
    source = "dry" if args.dry_run else (args.memory_source if args.memory_source != "auto" else Memory.choose())
    memory = Memory("meminfo" if source == "dry" else source)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dgxmm-gpu-check-") as tmp:
        dgx = Dgxmm(Path(tmp), args, source)
        try:
            body: dict[str, Any] = {
                "name": "gpu-check",
                "engine": "vllm",
                "model": args.model,
                "memory_gib": args.memory_gib,
                "mode": "on_demand",
                "sleep_mode": True,
                "idle_timeout_s": 3600,
            }
            if args.dry_run:
                body["env"] = {"PYTHONPATH": str(STANDIN)}
            dep_id = dgx.call("POST", "/deployments", json=body)["id"]
            labels = ("cold start, first", "cold start, cache kept", "cold start, cache cleared")
            for starts, label in enumerate(labels, start=1):
                if label.endswith("cleared"):
                    dgx.call("DELETE", f"/deployments/{dep_id}/compile-cache")
                took = dgx.chat("gpu-check")
                warm = statistics.median(dgx.chat("gpu-check") for _ in range(5))
                ready = dgx.ready_s(dep_id, starts)
                view = dgx.state(dep_id, "ready", timeout=60)
                env = engine_env(dep_id)
                rows.append(
                    {
                        "step": label,
                        "seconds": round(took, 2),
                        "engine_s": ready,
                        "dgxmm_added_s": round(took - ready - warm, 3),
                        "compile_cache": cache_said(dgx.run_lines(dep_id)),
                        "freed_gib": None,
                        "placed_on": view.get("gpu_ids"),
                        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", "(unset)"),
                    }
                )
                dgx.call("POST", f"/deployments/{dep_id}/stop")
                dgx.state(dep_id, "stopped", timeout=120)
            dgx.chat("gpu-check")
            view = dgx.state(dep_id, "ready", timeout=60)
            for level in SLEEP_LEVELS:
                before = memory.used_gib(view.get("gpu_ids"))
                began = time.perf_counter()
                dgx.call("POST", f"/deployments/{dep_id}/sleep")
                dgx.state(dep_id, "asleep", timeout=args.start_timeout_s)
                slept, asleep = time.perf_counter() - began, memory.used_gib(view.get("gpu_ids"))
                began = time.perf_counter()
                dgx.call("POST", f"/deployments/{dep_id}/wake")
                dgx.state(dep_id, "ready", timeout=args.start_timeout_s)
                woke = time.perf_counter() - began
                env = engine_env(dep_id)
                rows.append(
                    {
                        "step": f"sleep level {level}",
                        "seconds": round(slept, 2),
                        "engine_s": None,
                        "dgxmm_added_s": None,
                        "compile_cache": "",
                        "freed_gib": round(before - asleep, 2),
                        "placed_on": view.get("gpu_ids"),
                        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", "(unset)"),
                    }
                )
                rows.append({**rows[-1], "step": f"wake level {level}", "seconds": round(woke, 2), "freed_gib": None})
        finally:
            dgx.close()
    for row in rows:
        row["memory_source"] = "meminfo (dry run)" if source == "dry" else source
    return rows


COLUMNS = (
    ("step", "step"),
    ("seconds", "took (s)"),
    ("engine_s", "engine ready (s)"),
    ("dgxmm_added_s", "dgxmm added (s)"),
    ("compile_cache", "compile cache"),
    ("freed_gib", "memory freed (GiB)"),
    ("memory_source", "counted by"),
    ("placed_on", "placed on"),
    ("cuda_visible_devices", "CUDA_VISIBLE_DEVICES"),
)


def table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}".replace("-0.000", "0.000")
        return "-" if value is None else str(value)

    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(row[key]) for key, _ in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", help="a local model directory (downloads nothing) or a Hub name")
    parser.add_argument("--vllm-python", default=sys.executable, help="the Python that has vLLM")
    parser.add_argument("--memory-gib", type=float, default=16.0, help="the deployment's memory_gib")
    parser.add_argument("--memory-source", choices=("auto", "nvml", "meminfo"), default="auto")
    parser.add_argument("--start-timeout-s", type=float, default=1800.0)
    parser.add_argument("--dry-run", action="store_true", help="the suite's vLLM stand-in; no GPU")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.model = args.model or "org/stand-in"
    elif not args.model:
        parser.error("--model is required (a local path: nothing is downloaded)")
    rows = check(args)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
