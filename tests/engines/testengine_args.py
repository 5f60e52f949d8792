"""The test engine's command line (testengine.py): every flag with what it does, in one place
(``python tests/engines/testengine.py --help`` prints it)."""

from __future__ import annotations

import argparse
from pathlib import Path

FLAGS: list[tuple[tuple[str, ...], dict[str, object], str]] = [
    (("--host",), {"default": "127.0.0.1"}, "bind address; --port 0 picks one"),
    (("--port",), {"type": int, "required": True}, "the port"),
    (("--served-name", "--alias"), {"required": True}, "the model id served (--alias: llama-server's)"),
    (("-m",), {"dest": "model_path", "default": ""}, "llama-server's model path (testengine_media.props)"),
    (("-c", "--ctx-size"), {"type": int, "default": 0}, "llama-server's context (0: --max-model-len)"),
    (("--metrics",), {"action": "store_true"}, "llama-server's flag, accepted"),
    (("--reply",), {"default": "Hello from the test engine"}, "the words of every answer"),
    (("--start-delay",), {"type": float, "default": 0.0}, '/health answers 503 {"status":"loading"} for S seconds'),
    (("--listen-delay",), {"type": float, "default": 0.0}, "open the port only after S seconds (as vLLM, once loaded)"),
    (("--wake-delay",), {"type": float, "default": 0.0}, "POST /wake_up answers (awake) after S seconds"),
    (
        ("--start-gate",),
        {"default": None},
        "after the start delay, /health stays 503 loading until PATH exists (a test holds the load)",
    ),
    (
        ("--call-tools",),
        {"action": "store_true"},
        'a streamed chat whose body has tools ends with a call of the first one (finish_reason "tool_calls")',
    ),
    (("--fail-start",), {"action": "store_true"}, 'after the start delay: "simulated start failure" on stderr, exit 1'),
    (
        ("--oom-starts",),
        {"type": Path, "default": None},
        'while FILE holds a number above 0, a start counts it down, writes PyTorch\'s "CUDA out of memory" '
        "line on stderr and exits 1, after the start delay",
    ),
    (("--never-healthy",), {"action": "store_true"}, "/health is always 503"),
    (
        ("--busy-health-delay",),
        {"type": float, "default": 0.0},
        "/health answers only after S seconds while a request holds a seat (vLLM's CPU build starving its HTTP thread)",
    ),
    (
        ("--crash-after",),
        {"type": float, "default": None},
        'exit 3 ("simulated crash") S s after its first 200 answer to /health was sent',
    ),
    (
        ("--chunk-delay",),
        {"type": float, "default": 0.0},
        "sleep between stream chunks (non-streaming answers sleep about as long as their stream would take)",
    ),
    (("--max-num-seqs",), {"type": int, "default": 256}, "running seats; extra requests wait, FIFO"),
    (("--max-model-len",), {"type": int, "default": 2048}, "reported in /v1/models"),
    (("--status",), {"type": int, "default": None}, "traffic endpoints answer CODE with an OpenAI error"),
    (
        ("--sleep-mode",),
        {"action": "store_true"},
        "vLLM's sleep routes: POST /sleep (levels, tags), /wake_up, /collective_rpc, GET /is_sleeping (testengine_sleep.py)",
    ),
    (
        ("--close-after-stream",),
        {"action": "store_true"},
        "close the connection right after a streamed answer, advertising keep-alive all the same (llama-server)",
    ),
    (
        ("--idle-close",),
        {"type": float, "default": None},
        "close connections idle for S seconds, unannounced (uvicorn's keep-alive timeout)",
    ),
    (
        ("--max-requests-per-conn",),
        {"type": int, "default": None},
        'the N-th answer on a connection says "Connection: close" and closes it (cpp-httplib)',
    ),
    (("--ignore-sigterm",), {"action": "store_true"}, "SIGTERM does nothing, like an engine slow to stop"),
    (("--hold-mib",), {"type": int, "default": 0}, "hold N MiB of resident memory while it runs"),
    (
        ("--leave-child",),
        {"action": "store_true"},
        "start a child in a session of its own that outlives the engine (a daemonizing server's leftover)",
    ),
    (("--child-hold-mib",), {"type": int, "default": 0}, "that child is a Python process holding N MiB"),
    (("--metrics-names",), {"choices": ["vllm", "sglang"], "default": "vllm"}, "whose /metrics page it serves"),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="vLLM-like OpenAI test server (tests/engines/testengine.py)")
    for names, options, text in FLAGS:
        parser.add_argument(*names, help=text, **options)
    return parser.parse_args(argv)
