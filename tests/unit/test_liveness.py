"""The watchdog's rule (deploy/liveness.py), driven as a table: an engine is hung only when its
health check failed ``failures_needed`` times in a row and nothing else showed life meanwhile."""

from __future__ import annotations

import pytest

from dgxmm.deploy.liveness import HangCheck, Liveness

# Each tick: (health check passed, signs of life now); the verdict after the last tick.
CASES = [
    ("three failed checks, silent", [(False, 0), (False, 0), (False, 0)], True),
    ("two failed checks are not enough", [(False, 0), (False, 0)], False),
    ("a passed check starts the count again", [(False, 0), (False, 0), (True, 0), (False, 0), (False, 0)], False),
    ("after a pass, three more failures", [(False, 0), (True, 0), (False, 0), (False, 0), (False, 0)], True),
    ("bytes arriving keep a busy engine alive", [(False, 1), (False, 2), (False, 3), (False, 4), (False, 5)], False),
    ("a sign of life starts the count again", [(False, 0), (False, 0), (False, 1), (False, 1), (False, 1)], False),
    ("silent after the last sign of life", [(False, 1), (False, 1), (False, 1), (False, 1)], True),
    ("healthy but silent is alive", [(True, 0)] * 5, False),
]


@pytest.mark.parametrize(
    ("ticks", "hung"), [case[1:] for case in CASES], ids=[case[0].replace(" ", "_") for case in CASES]
)
def test_hang_check(ticks: list[tuple[bool, int]], hung: bool) -> None:
    check = HangCheck(3, 0)
    verdicts = [check.observe(healthy, signs) for healthy, signs in ticks]
    assert verdicts[-1] is hung
    assert not any(verdicts[:-1]), "the verdict came before the last tick"


def test_signs_come_from_every_source() -> None:
    liveness = Liveness()
    reads = {"a": 0}
    samples = {"a": 1.0}
    liveness.add_source(lambda dep_id: reads.get(dep_id, 0))
    liveness.add_source(lambda dep_id: samples.get(dep_id))
    before = liveness.signs("a")
    reads["a"] += 1
    assert liveness.signs("a") != before
    before = liveness.signs("a")
    samples["a"] = 2.0
    assert liveness.signs("a") != before
    assert liveness.signs("b") == (0, None)
