"""What every process of the gateway benchmark must agree on: the on-demand key and the one
address the gateway lets in, the deployment's name and its engine's reply (which fixes how many
SSE events a complete stream has), the three ways to reach the engine, the paced-stream phase's
parameters and the chat request itself. The orchestrator configures dgxmm and the engine from
these, and the load-generator process checks its responses against them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository: every process runs there
KEY = "sk-bench-ondemand-key"
CALLER = "127.0.0.2"  # the gateway's allowed peer; every load-generator connection binds to it
SERVED = "bench"
REPLY = " ".join(f"word{i:02d}" for i in range(48))  # 48 deltas + role + finish + [DONE] = 51 events
EVENTS_PER_STREAM = 51
TARGETS = ("direct", "nginx", "gateway")
PACED_DELAY = 0.05
PACED_DEADLINE = 60.0
PACED_RAMP = 1.0  # the paced streams start evenly spread over this many seconds (each lasts 2.5 s)


def chat_body(stream: bool) -> dict[str, Any]:
    """The one request every phase sends (the engine's reply does not depend on it)."""
    return {"model": SERVED, "messages": [{"role": "user", "content": "Say something."}], "stream": stream}
