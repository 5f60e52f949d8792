"""1000 mixed chat completions through the gateway to a real llama-server, checked from both ends.

llama-server closes its connection after every streamed answer while advertising keep-alive,
closes idle ones after 5 s and caps requests per connection (docs/gateway.md, "Connection
reuse"). Half of the requests are streamed, 8 are in flight at a time, and each must come back
200 and whole. "Seen once" is read from the engine itself: its log has one "processing task"
line per completion it ran, and its tokens_predicted_total counter must equal the completion
tokens of the answers received (a request run twice would generate tokens nobody got).

Used by tests/e2e/test_llamacpp_traffic.py (process runtime) and
tests/dockerrt/test_docker_traffic.py (docker runtime).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
from conftest import caller
from mixed_traffic import drive, failures

COUNT, CONCURRENCY = 1000, 8
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ARGS = ["-c", "2048", "-np", "2"]


def tasks_run(log: str) -> int:
    """Completions llama-server ran: one "launch_slot_: ... processing task" line each."""
    return sum(1 for line in log.splitlines() if "launch_slot_" in line and "processing task" in line)


async def tokens_predicted(base_url: str, auth: dict[str, str]) -> float:
    async with httpx.AsyncClient(timeout=10, headers=auth) as c:
        metrics = (await c.get(base_url + "/metrics")).text
    return float(re.search(r"^llamacpp:tokens_predicted_total (\S+)$", metrics, re.MULTILINE)[1])


async def run_traffic(svc, view: dict, engine_log: Callable[[], str]) -> None:
    """Drive the traffic; ``engine_log`` reads the engine's whole log (stdout and stderr)."""
    ready = await svc.wait_state(view["id"], "ready", timeout=90)
    auth = svc.engine_auth(view["id"])
    tasks_before, predicted_before = tasks_run(engine_log()), await tokens_predicted(ready["base_url"], auth)
    async with caller(svc, timeout=120) as g:
        outcomes = await drive(g, f"/{view['id']}/v1/chat/completions", COUNT, CONCURRENCY, BODY)
    bad = failures(outcomes)
    assert bad == [], f"{len(bad)} of {COUNT} failed, e.g. {bad[:3]}"
    assert all(o.completion_tokens for o in outcomes)
    assert tasks_run(engine_log()) - tasks_before == COUNT, "the engine ran some request other than once"
    got = sum(o.completion_tokens or 0 for o in outcomes)
    assert await tokens_predicted(ready["base_url"], auth) - predicted_before == got
