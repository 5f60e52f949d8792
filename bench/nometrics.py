#!/usr/bin/env python3
"""``dgxmm serve`` with the end of each gateway request (its metrics, its activity record and its
access line) made a no-op, and nothing read of what the answers cost (their token usage): the
baseline of bench/gateway.py's instrumentation phase, which runs this beside a normal dgxmm and
compares their CPU per request and their time to first byte. A benchmark's patch, not a dgxmm
setting.

    .venv/bin/python bench/nometrics.py serve --config FILE
"""

from __future__ import annotations

import sys

import dgxmm.gateway.forward
import dgxmm.gateway.gateway
import dgxmm.gateway.guard
from dgxmm.cli import main


def _nothing(*args: object) -> None:
    return None


class _NoUsage:
    """Reads nothing: ``gateway.usage.UsageReader``'s interface, every count unknown."""

    prompt_tokens = completion_tokens = engine_tps = None

    def __init__(self, stream: bool) -> None:
        self.stream = stream

    def whole(self, body: bytes) -> None:
        return None

    def feed(self, chunk: bytes) -> None:
        return None

    def end(self) -> None:
        return None


if __name__ == "__main__":
    dgxmm.gateway.gateway.finish = _nothing  # type: ignore[assignment]
    dgxmm.gateway.guard.finish = _nothing  # type: ignore[assignment]
    dgxmm.gateway.forward.UsageReader = _NoUsage  # type: ignore[assignment,misc]
    main(sys.argv[1:])
