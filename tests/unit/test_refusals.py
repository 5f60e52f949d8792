"""Requests refused before a valid key are counted and summarised, never recorded one by one
(telemetry/refusals.py, issue 34 item 3), and the gateway's route memo keeps nothing of them
(gateway/routes.py, item 2)."""

from __future__ import annotations

import logging

import pytest

from dgxmm.gateway.exchange import GONE, Exchange
from dgxmm.gateway.routes import Memo, Route, by_id
from dgxmm.telemetry import refusals as refusals_module
from dgxmm.telemetry.refusals import MAX_GROUPS, OTHER_PEERS, SAMPLES, Refusals


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(
    peer: str = "127.0.0.1", status: int = 401, code: str | None = "invalid_api_key", rid: str = "r"
) -> Exchange:
    ex = Exchange(0.0, rid, peer)
    ex.status, ex.code = status, code
    return ex


def test_a_flood_is_counted_per_peer_and_reason_and_only_the_first_few_are_written_in_full() -> None:
    clock, sampled = Clock(), []
    log = Refusals(sample=lambda method, path, ex: sampled.append(ex.request_id), clock=clock, wall=lambda: 5000.0)
    for i in range(10_000):
        log.add("POST", "/v1/chat/completions", refused(rid=f"a{i}"))
    for i in range(3):
        log.add("POST", "/v1/chat/completions", refused("127.0.0.9", 429, "rate_limited", rid=f"b{i}"))
    assert sampled == ["a0", "b0"]  # the first of each group, not one line per request
    report = log.report()
    assert report["total"] == 10_003 and report["recent"] == []
    assert [(g["peer"], g["status"], g["reason"], g["count"], g["first_request_id"]) for g in report["current"]] == [
        ("127.0.0.1", 401, "invalid_api_key", 10_000, "a0"),
        ("127.0.0.9", 429, "rate_limited", 3, "b0"),
    ]


def test_the_window_ends_with_one_summary_line_per_group(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = Refusals(window_s=60, clock=clock, wall=lambda: 5000.0)
    for _ in range(1204):
        log.add("POST", "/v1/x", refused())
    clock.now += 61
    with caplog.at_level(logging.WARNING, logger=refusals_module.__name__):
        log.add("POST", "/v1/x", refused(rid="next"))  # the next window's first: the last one is summarised
    assert [r.getMessage() for r in caplog.records] == [
        "1204 requests from 127.0.0.1 refused in the last 60 s: 401 invalid_api_key (first: request id r)"
    ]
    report = log.report()
    assert [(s["count"], s["since"], s["seconds"]) for s in report["recent"]] == [(1204, 5000.0, 60.0)]
    assert [g["first_request_id"] for g in report["current"]] == ["next"]


def test_many_peers_fold_into_one_group_past_the_bound() -> None:
    clock, sampled = Clock(), []
    log = Refusals(sample=lambda method, path, ex: sampled.append(ex.peer), clock=clock)
    for i in range(MAX_GROUPS + 500):
        log.add("GET", "/v1/models", refused(f"10.0.{i // 256}.{i % 256}", 404, "guard"))
    current = log.report()["current"]
    assert len(current) == MAX_GROUPS + 1
    assert [g for g in current if g["peer"] == OTHER_PEERS][0]["count"] == 500
    assert len(sampled) == SAMPLES  # full lines are bounded per window, whatever the peers


def test_a_hang_up_before_the_key_is_summarised_as_such() -> None:
    log = Refusals(clock=Clock())
    log.add("POST", "/v1/x", refused(status=GONE, code=None))
    [group] = log.report()["current"]
    assert (group["status"], group["reason"]) == (GONE, "hang_up")


def test_closing_writes_the_running_window(caplog: pytest.LogCaptureFixture) -> None:
    log = Refusals(clock=Clock())
    log.add("POST", "/v1/x", refused())
    with caplog.at_level(logging.WARNING, logger=refusals_module.__name__):
        log.close()
    assert len(caplog.records) == 1 and log.report()["current"] == []


def test_the_memo_keeps_short_paths_of_keyed_requests_and_forgets_the_oldest() -> None:
    memo = Memo(entries=2, path_bytes=64)
    route = by_id("GET", ("d1", "v1", "models"))
    assert route == Route("models", "models", "d1")
    memo.keep("GET", b"/ondemand/d1/v1/models", False, ("d1", "v1", "models"), route)
    assert memo.get("GET", b"/ondemand/d1/v1/models", False) == (("d1", "v1", "models"), route)
    assert memo.get("GET", b"/ondemand/d1/v1/models", True) is None  # the router's are apart
    memo.keep("GET", b"/" + b"x" * 64, False, ("x" * 63,), None)  # too long: checked each time
    assert len(memo) == 1
    memo.keep("GET", b"/a", False, ("a",), None)
    memo.keep("GET", b"/b", False, ("b",), None)
    assert len(memo) == 2 and memo.get("GET", b"/ondemand/d1/v1/models", False) is None


def test_the_finisher_records_keyed_requests_and_summarises_the_rest() -> None:
    from dgxmm.telemetry.access import Finisher
    from dgxmm.telemetry.activity import Activity
    from dgxmm.telemetry.metrics import Metrics

    activity = Activity(keep=10)
    finish = Finisher(Metrics(), activity)
    served = Exchange(0.0, "served", "127.0.0.1")
    served.keyed, served.status = True, 200
    finish("POST", "/v1/chat/completions", served)
    for i in range(100):
        finish("POST", "/v1/chat/completions", refused(rid=f"k{i}"))
    assert [r["request_id"] for r in activity.query()] == ["served"]
    assert finish.refusals.report()["total"] == 100
