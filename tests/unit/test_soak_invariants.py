"""The soak's verdicts (tests/soak/invariants.py) hold to their meaning: which failure a fault
explains, what counts as growth, how a quantile is read from a histogram."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soak"))

from chaos import Fault
from invariants import cold_overheads, explain, quantile, rows, steady_growth
from traffic import Outcome
from watch import ProcessSample


def failed(
    dep: str,
    began: float,
    ended: float,
    status: int = 502,
    code: str | None = "ondemand_upstream_error",
    kind: str = "error",
) -> Outcome:
    return Outcome(0, dep, False, began, ended, status, code, kind)


def test_a_fault_explains_its_own_deployments_failures_in_its_window() -> None:
    kill = Fault("engine SIGKILL", 10.0, 20.0, "a")
    outcomes = [
        failed("a", 9.0, 10.5),  # in flight when it happened
        failed("a", 15.0, 15.1),  # in its window
        failed("a", 21.0, 21.5),  # after it
        failed("b", 12.0, 12.5),  # another deployment
        failed("a", 12.0, 12.5, 503, "ondemand_queue_timeout"),  # not what a killed engine causes
        Outcome(0, "a", True, 12.0, 13.0, 200, None, "hangup"),  # not a failure
        Outcome(0, "a", True, 12.0, 13.0, 200, None, "ok"),
    ]
    explained, unexplained = explain(outcomes, [kill])
    assert sum(explained.values()) == 2
    assert [(o.deployment, o.began, o.code) for o in unexplained] == [
        ("a", 21.0, "ondemand_upstream_error"),
        ("b", 12.0, "ondemand_upstream_error"),
        ("a", 12.0, "ondemand_queue_timeout"),
    ]


def test_a_key_rotation_explains_only_401s_and_a_restart_anything() -> None:
    rotation = Fault("key rotation", 10.0, 12.0)
    restart = Fault("dgxmm restart", 30.0, 40.0)
    outcomes = [
        failed("a", 10.5, 10.6, 401, "invalid_api_key"),
        failed("b", 10.5, 10.6, 503, "start_failed"),
        failed("c", 35.0, 35.1, 0, None, "no_answer"),
        failed("c", 29.0, 31.0, 503, "shutting_down"),
    ]
    explained, unexplained = explain(outcomes, [rotation, restart])
    assert [o.code for o in unexplained] == ["start_failed"]
    assert explained == {
        "key rotation: 401 invalid_api_key": 1,
        "dgxmm restart: - no_answer": 1,
        "dgxmm restart: 503 shutting_down": 1,
    }


def test_growth_reads_the_longest_run_after_its_warm_up() -> None:
    first = [ProcessSample(float(t), 1, 500.0, 500) for t in range(30)]  # a short first run: not read
    steady = [ProcessSample(100.0 + t, 2, 80.0 + (t >= 60) * 10.0, 40 + (t >= 60) * 3) for t in range(90)]
    assert steady_growth(first + steady) == (10.0, 3)
    assert steady_growth(steady[:20]) is None  # the warm-up alone


@pytest.mark.parametrize(("q", "expected"), [(0.5, 1.0), (0.99, 9.82), (0.25, 0.5)])
def test_quantile_as_prometheus_reads_a_histogram(q: float, expected: float) -> None:
    buckets = [(1.0, 50.0), (10.0, 100.0), (float("inf"), 100.0)]
    assert quantile(buckets, q) == pytest.approx(expected)
    assert quantile([(1.0, 0.0), (float("inf"), 0.0)], q) is None


def test_the_table_fails_on_any_broken_invariant() -> None:
    samples = [ProcessSample(float(t), 1, 80.0, 40) for t in range(60)]
    ok = rows([], [], samples, leaked={}, busy_failures=[], lost_engines=[], orphans=[], metrics=[], skipped=[])
    assert all(row.ok is not False for row in ok)
    for broken in (
        {"leaked": {"m": "1 in flight"}},
        {"busy_failures": ["Failed: ..."]},
        {"lost_engines": ["pid 1 of a: 30 s"]},
        {"orphans": ["after the run: pid 1"]},
    ):
        args = {"leaked": {}, "busy_failures": [], "lost_engines": [], "orphans": [], **broken}
        table = rows([], [], samples, metrics=[], skipped=[], **args)  # type: ignore[arg-type]
        assert any(row.ok is False for row in table), broken
    unexplained = rows(
        [failed("a", 1.0, 2.0)],
        [],
        samples,
        leaked={},
        busy_failures=[],
        lost_engines=[],
        orphans=[],
        metrics=[],
        skipped=[],
    )
    assert any(row.ok is False for row in unexplained)


def test_the_cold_start_overhead_is_read_from_the_first_stream_that_waited_for_each_start() -> None:
    waited = Outcome(0, "a", True, 0.0, 0.0, 200, first_byte_at=100.30, began_at=99.0)
    later = Outcome(0, "a", True, 0.0, 0.0, 200, first_byte_at=100.50, began_at=99.5)
    after = Outcome(0, "a", True, 0.0, 0.0, 200, first_byte_at=101.00, began_at=100.9)  # came after the start
    not_stream = Outcome(0, "a", False, 0.0, 0.0, 200, first_byte_at=100.20, began_at=99.0)
    assert cold_overheads([later, waited, after, not_stream], {"a": [100.25], "b": [5.0]}) == pytest.approx([0.05])
