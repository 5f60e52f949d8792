#!/usr/bin/env python3
"""``dgxmm serve`` with the end of each gateway request (its metrics and its access line) made a
no-op: the baseline of bench/gateway.py's instrumentation phase, which runs this beside a normal
dgxmm and compares their CPU per request. A benchmark's patch, not a dgxmm setting.

    .venv/bin/python bench/nometrics.py serve --config FILE
"""

from __future__ import annotations

import sys

import dgxmm.gateway.gateway
import dgxmm.gateway.guard
from dgxmm.cli import main


def _nothing(*args: object) -> None:
    return None


if __name__ == "__main__":
    dgxmm.gateway.gateway.finish = _nothing  # type: ignore[assignment]
    dgxmm.gateway.guard.finish = _nothing  # type: ignore[assignment]
    main(sys.argv[1:])
