"""Answers to LiteLLM's health checks (``x-dgxmm-health-check: 1``), made by the gateway itself.

They say the gateway and the deployment record are there, not that the engine serves: a
health check must never wake a model, take a slot or run a generation.
"""

from __future__ import annotations

import time
from typing import Any

from dgxmm.records.deployment import Deployment

HEADER = b"x-dgxmm-health-check"


def answer(endpoint: str, dep: Deployment) -> dict[str, Any] | None:
    """A minimal empty answer of the endpoint's shape, or None if it has none."""
    now, model = int(time.time()), dep.served_name
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    shapes: dict[str, dict[str, Any]] = {
        "chat/completions": {
            "id": "ondemand-health",
            "object": "chat.completion",
            "created": now,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}],
            "usage": usage,
        },
        "completions": {
            "id": "ondemand-health",
            "object": "text_completion",
            "created": now,
            "model": model,
            "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
            "usage": usage,
        },
        "embeddings": {
            "object": "list",
            "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": []}],
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        },
        "responses": {
            "id": "ondemand-health",
            "object": "response",
            "created_at": now,
            "model": model,
            "status": "completed",
            "output": [],
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        },
        "messages": {
            "id": "ondemand-health",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        },
    }
    return shapes.get(endpoint)
