"""A start that ran out of memory (dgxmm.controller.oomretry): which failures are retried, and
what the retry's attempt does. Pure decisions, driven with hand-built tracks and snapshots
(test_decide_attempt.py's helpers): no I/O, no clock."""

from __future__ import annotations

from typing import Any

import pytest
from unit.test_decide import NOW, dep
from unit.test_decide_attempt import other, snap

from dgxmm.controller.decide import Action, MakeRoom, OomRetry, Progress, Settle, Start, Step, Track, next_action
from dgxmm.controller.oomretry import after_failed_start, plan_attempt
from dgxmm.deploy.placement import Need, Room
from dgxmm.records.deployment import State

OOM = "the engine exited with code 1 before it was ready\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
OTHER = "the engine exited with code 1 before it was ready\nsimulated start failure: --fail-start was given"


@pytest.mark.parametrize(
    ("started_for_request", "oom", "output", "expected"),
    [
        (True, OomRetry.NONE, OOM, OomRetry.ENDING),  # the controller's start ran out of memory: retried
        (True, OomRetry.NONE, OTHER, OomRetry.NONE),  # another failure: backoff
        (False, OomRetry.NONE, OOM, OomRetry.NONE),  # a start by hand fails as before
        (True, OomRetry.TAKEN, OOM, OomRetry.NONE),  # the retry ran out of memory too: backoff
        (True, OomRetry.DUE, OOM, OomRetry.NONE),  # (a start while one was due: not retried again)
    ],
    ids=["retried", "other_failure", "by_hand", "second_time", "while_due"],
)
def test_which_failed_start_is_retried(
    started_for_request: bool, oom: OomRetry, output: str, expected: OomRetry
) -> None:
    track = Track(idle_since=0.0, started_for_request=started_for_request, oom=oom)
    assert after_failed_start(track, output) is expected


@pytest.mark.parametrize(
    ("oom", "expected"),
    [(OomRetry.ENDING, Action.WAIT), (OomRetry.DUE, Action.START), (OomRetry.NONE, Action.START)],
)
def test_its_waiters_wait_while_its_engine_is_ended(oom: OomRetry, expected: Action) -> None:
    failed = dep(id="x", state=State.FAILED)
    assert next_action(failed, Track(idle_since=0.0, oom=oom), NOW) is expected


DUE = Track(idle_since=0.0, oom=OomRetry.DUE)
FAILED = dep(id="x", name="x", memory_gib=6, state=State.FAILED)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # not the retry: the plain plan (10 GiB free, x needs 6)
        ({"track": Track(idle_since=0.0), "others": (other("a", 4),)}, Start(wake=False, devices=(0,))),
        (
            {"track": Track(idle_since=0.0, oom=OomRetry.TAKEN), "others": (other("a", 4),)},
            Start(wake=False, devices=(0,)),
        ),
        # the retry with room for twice its need: it starts at once
        ({"free_gib": 12.0, "capacity_gib": 12.0}, Start(wake=False, devices=(0,))),
        # the retry: idle a (4 GiB) and b (3 GiB) are stopped for its 6 GiB shortfall (10 - 6 = 4 free
        # as the retry sees it: 2 short, a alone covers it; least recently used first)
        ({"others": (other("a", 4), other("b", 3, idle_for=400))}, MakeRoom(("b",))),
        ({"others": (other("a", 4, idle_for=500), other("b", 3, idle_for=400))}, MakeRoom(("a",))),
        # its victims stopped, their memory not shown free yet: it settles
        (
            {"others": (other("a", 4),), "progress": Progress(stopped_victim=True, settle_until=NOW + 5)},
            Settle(NOW + 5),
        ),
        # nothing idle to stop (a is busy): it starts on what is free
        ({"others": (other("a", 4, inflight=1),)}, Start(wake=False, devices=(0,))),
        # behind the head: no room made for it, the plain plan
        ({"queue": ("h", "x"), "others": (other("a", 4),)}, Start(wake=False, devices=(0,))),
        # the plain plan does not start it: that plan (here the head's make-room for the plain need)
        ({"free_gib": 2.0, "others": (other("a", 4),)}, MakeRoom(("a",))),
    ],
    ids=[
        "not_due",
        "taken",
        "room_for_both",
        "lru_victim_b",
        "lru_victim_a",
        "settles",
        "nothing_idle",
        "behind_head",
        "plain_make_room",
    ],
)
def test_the_retry_makes_room_for_its_shortfall(overrides: dict[str, Any], expected: Step) -> None:
    assert plan_attempt(snap(**{"dep": FAILED, "track": DUE, **overrides})) == expected


def test_the_retry_on_several_devices_is_short_on_each_it_may_use() -> None:
    """Two devices of 20 GiB free, x needs 16 on one: short by 16 each, so 4 are left; a's 12 on
    device 1 cover it there (c, on device 0, was used less recently but covers less)."""
    rooms = (Room(0, 20, 80), Room(1, 20, 80))
    others = (other("c", 8, idle_for=900, devices=(0,)), other("a", 12, devices=(1,)))
    step = plan_attempt(snap(dep=FAILED, track=DUE, rooms=rooms, need=Need(16), others=others))
    assert step == MakeRoom(("a",))
