"""A stand-in for ``python -m vllm.entrypoints.openai.api_server``: the test engine behind vLLM's
command line, so served tests can launch ``vllm`` deployments and read the argv dgxmm gave them
from the running process. It takes vLLM's --host, --port and --served-model-name and ignores the rest.
Like vLLM it keeps its "compiled graph" under ``VLLM_CACHE_ROOT`` and says, in vLLM's words,
whether it loaded it from there or compiled it (a file it writes; nothing is compiled).
The real vLLM is exercised by tests/vllm (``make test-vllm``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from testengine import main


def compile_once() -> None:
    root = os.environ.get("VLLM_CACHE_ROOT")
    if not root:
        return
    graph = Path(root) / "torch_compile_cache" / "standin" / "rank_0_0" / "graph.py"
    if graph.is_file():
        print("Directly load the compiled graph(s) for compile range (1, 8192) from the cache", file=sys.stderr)
        return
    graph.parent.mkdir(parents=True, exist_ok=True)
    graph.write_text("# a compiled graph\n" * 64)
    print("Compiling a graph for compile range (1, 8192) takes 0.01 s", file=sys.stderr)


if __name__ == "__main__":
    compile_once()
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--enable-sleep-mode", action="store_true")
    known, _ = parser.parse_known_args()
    sleep = ["--sleep-mode"] if known.enable_sleep_mode else []
    sys.exit(main(["--host", known.host, "--port", known.port, "--served-name", known.served_model_name, *sleep]))
