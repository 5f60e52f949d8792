"""5,000 requests of the generated hostile corpus (tests/hostile/corpus.py; ``make fuzz`` replays
100,000): dgxmm itself never answers 5xx (but the spec's 503s about a deployment's state), and its
RSS stays within the hostile suite's bound. Then 300 hostile GGUFs (``make fuzz``: 2,000) posted
to ``/api/estimate``: each an estimate or a 422 within a second. Then every hostile declared
file shape and 30 variations (``make fuzz``: 200) met by the watcher and ``/api/config/plan``:
each refused within two seconds, and the files valid again once they are gone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import KEY
from served import until

from hostile.corpus import corpus, documented, gguf_corpus, replay, replay_ggufs
from hostile.harness import Front, Peak, bounded
from hostile.tomls import replay_tomls, toml_corpus

pytestmark = pytest.mark.hostile

REQUESTS = 5000
GGUFS = 300
TOMLS = 30


def test_a_corpus_of_hostile_gateway_requests_gets_no_5xx(front: Front) -> None:
    with Peak(front.served) as peak:
        result = asyncio.run(replay(front.served.port, corpus(1, REQUESTS, front.deployment["id"], KEY)))
    assert sum(result.statuses.values()) == REQUESTS
    assert result.server_errors == []
    assert result.statuses[200] > REQUESTS / 10, result.statuses  # a good share reached the engine and came back
    assert {400, 404} <= set(result.statuses)  # and refusals of the path, the headers and the route
    bounded(front, f"{REQUESTS} corpus requests", peak)
    front.clear_engine()


def test_hostile_ggufs_get_an_estimate_or_a_422_within_a_second(front: Front, tmp_path: Path) -> None:
    with Peak(front.served) as peak:
        result = replay_ggufs(front.served, tmp_path, gguf_corpus(1, GGUFS))
    assert result.server_errors == []
    assert result.statuses[422] > GGUFS / 2, result.statuses  # most mutations break the file
    bounded(front, f"{sum(result.statuses.values())} hostile GGUFs posted to /api/estimate", peak)


def test_hostile_declared_files_are_refused_within_two_seconds(front: Front) -> None:
    with Peak(front.served) as peak:
        result = replay_tomls(front.served, front.declared_dir, toml_corpus(1, TOMLS))
    assert result.server_errors == []
    assert sum(result.statuses.values()) > TOMLS and set(result.statuses) == {200}
    bounded(front, f"{sum(result.statuses.values())} hostile declared files", peak)
    until(lambda: front.host()["config"]["error"] is None, timeout=30)  # the watcher went on


@pytest.mark.parametrize(
    ("status", "code", "fault"),
    [
        (503, "ondemand_health_unsupported", False),
        (503, "ondemand_not_ready", False),
        (500, "ondemand_not_ready", True),
        (503, "server_busy", True),
        (502, "ondemand_upstream_error", True),
    ],
)
def test_only_the_specs_state_503s_are_not_counted_as_faults(status: int, code: str, fault: bool) -> None:
    body = json.dumps({"error": {"message": "m", "type": "server_error", "code": code}}).encode()
    assert documented(status, body) is not fault
    assert not documented(503, b"Service Unavailable")  # (no error envelope: a fault)
