#!/usr/bin/env python3
"""The CPU a gateway request spends on its instrumentation, measured in-process, precisely.

    .venv/bin/python bench/instrumentation.py [--requests N]

bench/gateway.py measures the same end to end (a dgxmm with and without it, CPU per request), but
a few microseconds vanish in the noise of a 170 us request on a shared machine; here each part
runs N times in a loop and the time of an empty loop of the same shape is subtracted:

* ``exchange``: what every request does for its metrics and its request id: an ``Exchange``
  (the id taken from a sane ``x-request-id``, or generated) and the attributes the gateway and
  the forwarder set on it (route, deployment, status, first byte, bytes);
* ``finish``: the end of the request: ``Metrics.exchange_done`` (request counter, duration,
  first byte, bytes, cold start, tokens), its activity record (kept in memory, published to a
  console that has none open) and the access log's level check (info is off, as in the
  benchmark's dgxmm);
* ``usage``: reading what the answer cost from its bytes after they were sent
  (``gateway.usagescan.UsageReader``): a JSON answer with its ``usage``, and per event of a stream
  (an event without it: one search);
* the same whole request with its access line written (``log_level = "info"``, the default) in
  each ``log_format``, to /dev/null: logging's own cost, which a served dgxmm pays too;
* ``scrape``: one ``GET /metrics`` body for 20 deployments (not per request).

Printed as microseconds of CPU (``time.process_time``) per request.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import generate_latest

from dgxmm.deploy.budget import Snapshot
from dgxmm.records.deployment import Deployment, Mode, State
from dgxmm.controller.decide import Track
from dgxmm.gateway.usagescan import UsageReader
from dgxmm.telemetry.access import finish
from dgxmm.telemetry.activity import Activity
from dgxmm.telemetry.collector import Collector, Sources
from dgxmm.gateway.exchange import Exchange, request_id
from dgxmm.logs import configure
from dgxmm.telemetry.metrics import Metrics

SCOPE_GIVEN: dict[str, Any] = {
    "method": "POST",
    "path": "/dgxmm/ondemand/abc/v1/chat/completions",
    "headers": [
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer k"),
        (b"x-request-id", b"0f8c9e2a-0b1c-4d5e-8f90-123456789abc"),
    ],
}
SCOPE_NONE: dict[str, Any] = {**SCOPE_GIVEN, "headers": SCOPE_GIVEN["headers"][:2]}
ANSWER = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1796049761,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"' + b"word " * 100 + b'"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":12,"completion_tokens":100,"total_tokens":112}}'
)
EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" w"}}]}\n\n'
)


class Fleet:
    """20 ready deployments for the scrape."""

    def __init__(self) -> None:
        self.deps = [
            Deployment(
                id=f"d{i:02d}",
                name=f"m{i}",
                served_name=f"m{i}",
                engine="vllm",
                memory_gib=4,
                mode=Mode.ON_DEMAND,
                state=State.READY,
            )
            for i in range(20)
        ]

    def all(self) -> list[Deployment]:
        return list(self.deps)

    def add_listener(self, listener: Any) -> None:
        pass

    def snapshot(self, exclude: str | None = None) -> Snapshot:
        return Snapshot(usable=128, held=80, fixed=0, measured_free=None)

    def clock(self) -> float:
        return 0.0

    def tracked(self, deployment_id: str) -> Track:
        return Track(idle_since=0.0, inflight=1)

    def latest(self, deployment_id: str) -> None:
        return None


def per_call(fn: Callable[[], object], n: int) -> float:
    """CPU microseconds per call of ``fn`` over ``n`` calls, minus an empty call's."""

    def empty() -> None:
        return None

    def loop(f: Callable[[], object]) -> float:
        t0 = time.process_time()
        for _ in range(n):
            f()
        return time.process_time() - t0

    loop(fn)  # warm up
    return max(0.0, (loop(fn) - loop(empty)) * 1e6 / n)


def measure(n: int = 200_000) -> dict[str, float]:
    """Microseconds of CPU per request for each part (see the module's docstring)."""
    logging.getLogger("dgxmm.access").setLevel(logging.WARNING)  # as in the benchmark's dgxmm
    fleet = Fleet()
    metrics = Metrics()
    metrics.watch(fleet)
    metrics.registry.register(Collector(metrics, Sources(fleet, fleet, fleet, None, "bench", "bench")))  # type: ignore[arg-type]
    now = time.monotonic

    def exchange(scope: dict[str, Any]) -> Exchange:
        ex = Exchange(now(), request_id(scope["headers"]), "127.0.0.2")
        ex.route = "chat/completions"
        ex.deployment_id, ex.served_name = "d07", "m7"
        ex.status = 200
        ex.engine_byte = ex.first_byte = now()
        ex.bytes = 13_000
        return ex

    activity = Activity(keep=10_000, publish=lambda record: None)

    def counted(body: bytes, stream: bool) -> None:
        reader = UsageReader(stream)
        reader.whole(body)
        reader.end()

    done, stream = exchange(SCOPE_GIVEN), UsageReader(stream=True)
    results = {
        "exchange, caller's request id": per_call(lambda: exchange(SCOPE_GIVEN), n),
        "exchange, generated request id": per_call(lambda: exchange(SCOPE_NONE), n),
        "finish (metrics + activity record + access log check)": per_call(
            lambda: finish(metrics, "POST", SCOPE_GIVEN["path"], done, activity), n
        ),
        "usage of a JSON answer (its usage parsed)": per_call(lambda: counted(ANSWER, stream=False), n),
        "usage, per stream event without it (one search)": per_call(lambda: stream.feed(EVENT), n),
        "whole request": per_call(
            lambda: finish(metrics, "POST", SCOPE_NONE["path"], exchange(SCOPE_NONE), activity), n
        ),
    }
    with open(os.devnull, "w") as null:  # the access line written, at the default log_level info
        logging.getLogger("dgxmm.access").setLevel(logging.INFO)
        for log_format in ("text", "json"):
            configure("info", log_format)
            logging.getLogger().handlers[0].setStream(null)  # type: ignore[attr-defined]
            access_line = per_call(
                lambda: finish(metrics, "POST", SCOPE_NONE["path"], exchange(SCOPE_NONE), activity), n // 4
            )
            results[f"whole request, access line written ({log_format})"] = access_line
        logging.getLogger().handlers.clear()
    scrapes = max(1, n // 2000)
    t0 = time.process_time()
    for _ in range(scrapes):
        size = len(generate_latest(metrics.registry))
    results[f"scrape of 20 deployments ({size} bytes), per scrape"] = (time.process_time() - t0) * 1e6 / scrapes
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    args = parser.parse_args()
    for label, us in measure(args.requests).items():
        print(f"{label:55s} {us:8.2f} us")


if __name__ == "__main__":
    main()
