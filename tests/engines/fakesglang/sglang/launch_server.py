"""A stand-in for ``python -m sglang.launch_server``: the test engine behind SGLang's command line
and its /metrics names, so served tests can start ``sglang`` deployments. It takes SGLang's
--host, --port and --served-model-name, puts SGLang's names on /metrics only with --enable-metrics
(SGLang serves none without it; the stand-in then shows vLLM's, which dgxmm does not read for an
sglang deployment), and ignores the rest. SGLang's own parser checks dgxmm's flags in tests/sglang."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from testengine import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--enable-metrics", action="store_true")
    known, _ = parser.parse_known_args()
    names = ["--metrics-names", "sglang"] if known.enable_metrics else []
    sys.exit(main(["--host", known.host, "--port", known.port, "--served-name", known.served_model_name, *names]))
