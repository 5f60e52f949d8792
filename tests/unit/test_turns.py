"""The rules of turns under ``max_concurrent`` and of what a waiting request waits for, as tables
(controller/turns.py: pure functions)."""

from __future__ import annotations

import pytest

from dgxmm.controller import turns
from dgxmm.controller.turns import WaitsFor
from dgxmm.records.deployment import Deployment, Mode, State


@pytest.mark.parametrize(
    ("limit", "inflight", "free"),
    [
        (None, 0, None),
        (None, 500, None),
        (1, 0, 1),
        (1, 1, 0),
        (2, 1, 1),
        (2, 2, 0),
        (2, 5, 0),  # lowered while 5 ran: none until 3 ended
        (10, 3, 7),
    ],
)
def test_free_slots(limit: int | None, inflight: int, free: int | None) -> None:
    assert turns.free_slots(limit, inflight) == free


@pytest.mark.parametrize(
    ("limit", "inflight", "waiting", "at_once"),
    [
        (None, 0, 0, True),
        (None, 100, 0, True),
        (None, 0, 1, False),  # someone waits before it (a start's waiters not resumed yet): no barging
        (2, 0, 0, True),
        (2, 1, 0, True),
        (2, 2, 0, False),  # the limit: it waits
        (2, 1, 1, False),  # a slot is free, but one waits before it: the slot is the waiter's
        (2, 3, 0, False),
        (1, 0, 3, False),
    ],
)
def test_takes_at_once(limit: int | None, inflight: int, waiting: int, at_once: bool) -> None:
    assert turns.takes_at_once(limit, inflight, waiting) is at_once


@pytest.mark.parametrize(
    ("limit", "inflight", "waiting", "count"),
    [
        (None, 0, 5, 5),  # no limit: every waiter of a model that turned ready
        (None, 3, 0, 0),
        (2, 1, 5, 1),  # one slot released: the longest waiter
        (2, 0, 5, 2),  # ready now: two
        (2, 2, 5, 0),
        (2, 0, 1, 1),
        (3, 5, 4, 0),  # lowered below what runs
        (4, 1, 2, 2),  # raised: as many as wait
    ],
)
def test_handed(limit: int | None, inflight: int, waiting: int, count: int) -> None:
    assert turns.handed(limit, inflight, waiting) == count


def dep(state: State, mode: Mode = Mode.ON_DEMAND, pending: Mode | None = None) -> Deployment:
    return Deployment(
        id="a", name="a", served_name="a", engine="command", memory_gib=1, mode=mode, state=state, pending_mode=pending
    )


@pytest.mark.parametrize(
    ("deployment", "drained", "queued", "kind"),
    [
        (dep(State.STOPPED), False, True, WaitsFor.MEMORY),
        (dep(State.READY), True, False, WaitsFor.DRAIN),
        (dep(State.STOPPED), True, True, WaitsFor.MEMORY),  # stopped by the drain, queued again
        (dep(State.READY), False, False, WaitsFor.TURN),
        (dep(State.READY, Mode.ALWAYS_ON), False, False, WaitsFor.TURN),
        (dep(State.STARTING), False, False, WaitsFor.START),
        (dep(State.STOPPED, pending=Mode.ALWAYS_ON), False, False, WaitsFor.START),
        (dep(State.STOPPED), False, False, WaitsFor.START),
        (dep(State.FAILED), False, False, WaitsFor.START),
        (dep(State.ASLEEP), False, False, WaitsFor.START),
        (dep(State.STOPPING), False, False, WaitsFor.STOP),
        (dep(State.PLANNED), False, False, WaitsFor.PLANNED),
        (dep(State.STOPPED, Mode.ALWAYS_ON), False, False, WaitsFor.ENGINE),
        (dep(State.STOPPING, Mode.ALWAYS_ON), False, False, WaitsFor.ENGINE),
        (dep(State.STARTING, Mode.ALWAYS_ON), False, False, WaitsFor.START),
    ],
)
def test_waits_for(deployment: Deployment, drained: bool, queued: bool, kind: WaitsFor) -> None:
    assert turns.waits_for(deployment, drained, queued) is kind
