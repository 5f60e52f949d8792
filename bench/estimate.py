#!/usr/bin/env python3
"""``dgxmm estimate`` against what a real llama-server holds (issue 29): the table in
docs/engines.md.

    .venv/bin/python bench/estimate.py --llama-server BIN [--json FILE]

For a few generated llama GGUFs with random weights (the demo's writer, F16, from about 200 MB to
1 GB) and a few contexts and cache types, it starts llama-server alone (``-np 1``, on the CPU),
sends one chat once it answers, and measures its process tree as dgxmm does (the PSS of every
process in its session, ``dgxmm.deploy.usage``), then compares with the estimate for the same
arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from servers import free_port, log

from dgxmm.demo.tiny_gguf import write_random_gguf
from dgxmm.deploy.estimate import GIB, estimate
from dgxmm.deploy.usage import session_usage

# (name, n_embd, n_ff, n_layer, n_head, n_head_kv, trained context)
MODELS = [
    ("llama-0.2GB", 1024, 2816, 8, 16, 4, 4096),
    ("llama-0.5GB", 1024, 2816, 24, 16, 4, 4096),
    ("llama-1GB", 1536, 4096, 24, 16, 8, 8192),
]
# (model, extra llama-server arguments)
RUNS = [
    ("llama-0.2GB", []),
    ("llama-0.2GB", ["-c", "16384"]),
    ("llama-0.5GB", []),
    ("llama-0.5GB", ["-c", "1024"]),
    ("llama-0.5GB", ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"]),
    ("llama-1GB", []),
    ("llama-1GB", ["-c", "2048"]),
    ("llama-0.5GB", ["-c", "4096", "-fa", "off"]),
]


def measure(binary: str, model: Path, extra: list[str]) -> int:
    """The PSS of llama-server's process tree after one answer."""
    port = free_port()
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", "1", *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {proc.returncode}: {' '.join(argv)}")
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("llama-server did not become healthy")
                time.sleep(0.1)
            client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
            )
        time.sleep(0.5)
        return session_usage(proc.pid).host_bytes
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="dgxmm-estimate-"))
    rows = []
    try:
        files = {}
        for name, embd, ff, layers, heads, kv_heads, ctx in MODELS:
            log(f"writing {name}")
            files[name] = write_random_gguf(
                tmp / f"{name}.gguf",
                n_embd=embd,
                n_ff=ff,
                n_layer=layers,
                n_head=heads,
                n_head_kv=kv_heads,
                n_ctx=ctx,
                f16=True,
                name=name,
            )
        for name, extra in RUNS:
            log(f"{name} {' '.join(extra)}")
            est = estimate(files[name], extra)
            measured = measure(args.llama_server, files[name], extra)
            rows.append(
                {
                    "model": name,
                    "file_mb": files[name].stat().st_size / 1e6,
                    "args": " ".join(extra) or "-",
                    **est.as_dict(),
                    "measured_gib": measured / GIB,
                    "error": (est.total_bytes - measured) / measured,
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n# dgxmm estimate against llama-server, {time.strftime('%Y-%m-%d %H:%M %Z')}\n")
    print("| model (F16) | file | args | context | weights | KV cache | overhead | estimate | measured | error |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['model']} | {r['file_mb']:.0f} MB | {r['args']} | {r['context']} | {r['weights_gib']:.3f} | "
            f"{r['kv_cache_gib']:.3f} | {r['overhead_gib']:.3f} | {r['total_gib']:.3f} GiB | "
            f"{r['measured_gib']:.3f} GiB | {r['error']:+.1%} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
