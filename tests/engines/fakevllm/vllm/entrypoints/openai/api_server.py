"""A stand-in for ``python -m vllm.entrypoints.openai.api_server``: the test engine behind vLLM's
command line, so served tests can launch ``vllm`` deployments and read the argv dgxmm gave them
from the running process. It takes vLLM's --port and --served-model-name and ignores the rest.
The real vLLM is exercised by tests/vllm (``make test-vllm``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from testengine import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", required=True)
    parser.add_argument("--served-model-name", required=True)
    known, _ = parser.parse_known_args()
    sys.exit(main(["--port", known.port, "--served-name", known.served_model_name]))
