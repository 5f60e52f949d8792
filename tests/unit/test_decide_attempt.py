"""The on-demand controller's pure decisions, continued: the phase a deployment shows and the
plan of one start attempt (dgxmm.controller.decide). test_decide.py has the rest and the helpers.

No I/O, no clock, no sleeps: every time is a plain number passed in. Expected values come from
the on-demand specification's controller rules, not from the code.
"""

from __future__ import annotations

from typing import Any

import pytest
from unit.test_decide import DEFAULT_TIMEOUT, MAX_AGE, NOW, check_idle, dep, fresh_sample, idle_track

from dgxmm.deploy.placement import Need, Room
from dgxmm.deploy.sampler import Sample
from dgxmm.records.deployment import Mode, State
from dgxmm.controller.phase import Phase, phase
from dgxmm.controller.decide import (
    Abandon,
    AttemptSnapshot,
    Drain,
    Enqueue,
    GiveUp,
    MakeRoom,
    Moot,
    OomRetry,
    Other,
    Progress,
    Rules,
    Settle,
    Start,
    Step,
    Track,
    freed_for_head,
    plan_attempt,
)

# --- phase ----------------------------------------------------------------------------------------


def trk(inflight: int = 0, started_for_request: bool = False) -> Track:
    return Track(idle_since=0.0, inflight=inflight, started_for_request=started_for_request)


REMOVED = None  # a deployment that no longer exists


@pytest.mark.parametrize(
    ("state", "track", "queued", "expected"),
    [
        # queued wins over everything
        (State.STOPPED, trk(), True, Phase.QUEUED),
        (State.READY, trk(inflight=2), True, Phase.QUEUED),  # queued and serving at once
        (State.STARTING, trk(started_for_request=True), True, Phase.QUEUED),
        (State.STARTING, trk(inflight=1, started_for_request=True), True, Phase.QUEUED),
        (State.FAILED, trk(), True, Phase.QUEUED),
        (REMOVED, None, True, Phase.QUEUED),
        (State.ASLEEP, None, True, Phase.QUEUED),
        # starting for a request, over serving
        (State.STARTING, trk(started_for_request=True), False, Phase.STARTING_FOR_REQUEST),
        (State.STARTING, trk(inflight=1, started_for_request=True), False, Phase.STARTING_FOR_REQUEST),
        # starting without started_for_request (by hand) is not starting_for_request
        (State.STARTING, trk(), False, Phase.IDLE),
        (State.STARTING, trk(inflight=1), False, Phase.SERVING),
        (State.STARTING, None, False, Phase.IDLE),
        # started_for_request only counts while starting
        (State.READY, trk(started_for_request=True), False, Phase.IDLE),
        (State.READY, trk(inflight=1, started_for_request=True), False, Phase.SERVING),
        (State.FAILED, trk(started_for_request=True), False, Phase.FAILED),
        # ran out of memory: its engine is being ended, and it starts again for its requests
        (State.FAILED, Track(idle_since=0.0, oom=OomRetry.ENDING), False, Phase.STARTING_FOR_REQUEST),
        (State.FAILED, Track(idle_since=0.0, oom=OomRetry.DUE), False, Phase.FAILED),
        (State.FAILED, Track(idle_since=0.0, inflight=1, oom=OomRetry.ENDING), True, Phase.QUEUED),
        (REMOVED, trk(started_for_request=True), False, Phase.FAILED),
        # serving, over failed and sleeping
        (State.READY, trk(inflight=1), False, Phase.SERVING),
        (State.FAILED, trk(inflight=1), False, Phase.SERVING),
        (REMOVED, trk(inflight=1), False, Phase.SERVING),
        (State.STOPPING, trk(inflight=1), False, Phase.SERVING),
        # failed: failed state or removed
        (State.FAILED, trk(), False, Phase.FAILED),
        (State.FAILED, None, False, Phase.FAILED),
        (REMOVED, trk(), False, Phase.FAILED),
        (REMOVED, None, False, Phase.FAILED),
        # sleeping: stopped, asleep, stopping
        (State.STOPPED, trk(), False, Phase.SLEEPING),
        (State.ASLEEP, trk(), False, Phase.SLEEPING),
        (State.STOPPING, trk(), False, Phase.SLEEPING),
        (State.STOPPED, None, False, Phase.SLEEPING),
        (State.ASLEEP, trk(started_for_request=True), False, Phase.SLEEPING),
        # idle: the rest
        (State.READY, trk(), False, Phase.IDLE),
        (State.READY, None, False, Phase.IDLE),
        (State.PLANNED, trk(), False, Phase.IDLE),
    ],
    ids=[
        "q_stopped",
        "q_and_serving",
        "q_and_starting_for_request",
        "q_and_sfr_and_serving",
        "q_failed",
        "q_removed",
        "q_no_track",
        "sfr",
        "sfr_over_serving",
        "starting_by_hand_idle",
        "starting_by_hand_serving",
        "starting_no_track",
        "ready_sfr_flag_idle",
        "ready_sfr_flag_serving",
        "failed_sfr_flag",
        "oom_retry_ending",
        "oom_retry_due",
        "q_over_oom_retry",
        "removed_sfr_flag",
        "serving",
        "serving_over_failed",
        "serving_over_removed",
        "serving_over_stopping",
        "failed",
        "failed_no_track",
        "removed",
        "removed_no_track",
        "stopped",
        "asleep",
        "stopping",
        "stopped_no_track",
        "asleep_sfr_flag",
        "ready_idle",
        "ready_no_track",
        "planned_idle",
    ],
)
def test_phase_precedence(state: State | None, track: Track | None, queued: bool, expected: Phase) -> None:
    """queued > starting_for_request > serving > failed (or removed) > sleeping > idle."""
    d = None if state is None else dep(state=state)
    assert phase(d, track, queued) is expected


def test_phase_values_are_the_spec_strings() -> None:
    """status() exposes phase.value; the strings are the spec's."""
    assert [p.value for p in Phase] == [
        "queued",
        "starting_for_request",
        "serving",
        "failed",
        "sleeping",
        "idle",
    ]


# --- plan_attempt ---------------------------------------------------------------------------------

RULES = Rules(idle_timeout_s=DEFAULT_TIMEOUT, metrics_max_age_s=MAX_AGE, stop_settle_s=20.0)
EVICT_0 = Rules(idle_timeout_s=DEFAULT_TIMEOUT, metrics_max_age_s=MAX_AGE, stop_settle_s=20.0, evict_idle_s=0.0)
DRAIN_3 = Rules(idle_timeout_s=DEFAULT_TIMEOUT, metrics_max_age_s=MAX_AGE, stop_settle_s=20.0, max_drain_wait_s=3.0)


def other(
    id: str,
    gib: float,
    *,
    idle_for: float = DEFAULT_TIMEOUT,
    state: State = State.READY,
    inflight: int = 0,
    sample: Sample | None = None,
    owed: bool = False,
    held: float | None = None,
    devices: tuple[int, ...] = (0,),
) -> Other:
    """Another on-demand deployment, idle for ``idle_for`` with a fresh idle sample."""
    d = dep(id=id, name=id, memory_gib=gib, state=state)
    return Other(
        d, Track(idle_since=NOW - idle_for, inflight=inflight, owed=owed), sample or fresh_sample(), held, devices
    )


def snap(**overrides: Any) -> AttemptSnapshot:
    """x (6 GiB, stopped) with one waiter, an empty queue, 10 GiB free of 10 GiB capacity."""
    fields: dict[str, Any] = {
        "deployment_id": "x",
        "dep": dep(id="x", name="x", memory_gib=6, state=State.STOPPED),
        "track": Track(idle_since=0.0),
        "waiters": 1,
        "now": NOW,
        "queue": (),
        "head_victims": {},
        "free_gib": 10.0,
        "capacity_gib": 10.0,
        "others": (),
        "last_stop": -1e9,
        "progress": Progress(),
        "rules": RULES,
    }
    fields.update(overrides)
    return AttemptSnapshot(**fields)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # 1. nobody waits, or removed: abandon
        ({"waiters": 0}, Abandon()),
        ({"dep": None}, Abandon()),
        # 2. not a state the controller starts from: moot
        ({"dep": dep(id="x", memory_gib=6, state=State.STARTING)}, Moot()),
        ({"dep": dep(id="x", memory_gib=6, state=State.READY)}, Moot()),
        ({"dep": dep(id="x", memory_gib=6, state=State.STOPPED, pending_mode=Mode.ALWAYS_ON)}, Moot()),
        ({"track": Track(idle_since=0.0, refused_until=NOW + 1)}, Moot()),  # backoff: waiters refuse
        # 3. fits: start or wake
        ({}, Start(wake=False, devices=(0,))),
        ({"dep": dep(id="x", memory_gib=6, state=State.FAILED)}, Start(wake=False, devices=(0,))),
        ({"dep": dep(id="x", memory_gib=6, state=State.ASLEEP)}, Start(wake=True, devices=(0,))),
        ({"queue": ("x", "y")}, Start(wake=False, devices=(0,))),  # the head
        ({"queue": ("h",), "free_gib": 6.0}, Start(wake=False, devices=(0,))),  # behind a head that freed nothing
        # ... behind the head, beside what was freed for it (h's victim v is stopped: 3 freed)
        (
            {
                "queue": ("h",),
                "free_gib": 9.0,
                "head_victims": {"v": 3.0},
                "others": (other("v", 3, state=State.STOPPED),),
            },
            Start(wake=False, devices=(0,)),
        ),
        # 4. more than the capacity: give up, unless within the grace or after its own victims
        ({"free_gib": 2.0, "capacity_gib": 5.0}, GiveUp(6, 5.0)),
        ({"free_gib": 2.0, "capacity_gib": 5.0, "queue": ("h",)}, GiveUp(6, 5.0)),  # behind a head too
        ({"free_gib": 2.0, "capacity_gib": 5.0, "last_stop": NOW - 19.9}, Enqueue()),
        ({"free_gib": 2.0, "capacity_gib": 5.0, "last_stop": NOW - 20.0}, GiveUp(6, 5.0)),
        ({"free_gib": 2.0, "capacity_gib": 5.0, "progress": Progress(stopped_victim=True)}, Enqueue()),
        # 5. behind the head: queue, even when idle victims exist (only the head makes room)
        ({"queue": ("h",), "free_gib": 2.0, "others": (other("v", 6),)}, Enqueue()),
        # ... and when it fits in free memory but not beside the head's freed reservation
        (
            {
                "queue": ("h",),
                "free_gib": 8.0,
                "head_victims": {"v": 3.0},
                "others": (other("v", 3, state=State.STOPPED),),
            },
            Enqueue(),
        ),
        # 6. the head whose victims were just stopped: settle until the deadline, then look again
        ({"free_gib": 2.0, "progress": Progress(True, settle_until=NOW + 5)}, Settle(NOW + 5)),
        ({"free_gib": 2.0, "progress": Progress(True, settle_until=NOW), "others": (other("v", 4),)}, MakeRoom(("v",))),
        # 7. make room: least recently used first until covered
        (
            {
                "free_gib": 2.0,
                "others": (other("new", 3, idle_for=400), other("old", 3, idle_for=900), other("mid", 3, idle_for=600)),
            },
            MakeRoom(("old", "mid")),
        ),
        ({"free_gib": 2.0, "queue": ("x",), "others": (other("v", 4),)}, MakeRoom(("v",))),
        # 8. victims not enough (or none idle): queue, stopping nobody
        ({"free_gib": 2.0, "others": (other("v", 3),)}, Enqueue()),
        ({"free_gib": 2.0, "others": (other("busy", 6, inflight=1),)}, Enqueue()),
        ({"free_gib": 2.0, "others": (other("fresh", 6, idle_for=10),)}, Enqueue()),
        ({"free_gib": 2.0, "others": (other("running", 6, sample=fresh_sample(running=1)),)}, Enqueue()),
        # a victim measured above its declaration frees what it holds (issue 29)
        ({"free_gib": 2.0, "others": (other("v", 3, held=4.5),)}, MakeRoom(("v",))),
        # evict_idle_s: make-room's own idle rule (0: nothing in flight, an idle sample)
        ({"free_gib": 2.0, "rules": EVICT_0, "others": (other("fresh", 6, idle_for=0.5),)}, MakeRoom(("fresh",))),
        ({"free_gib": 2.0, "rules": EVICT_0, "others": (other("busy", 6, inflight=1),)}, Enqueue()),
        (
            {
                "free_gib": 2.0,
                "rules": EVICT_0,
                "others": (other("fresh", 6, idle_for=0.5, sample=fresh_sample(running=1)),),
            },
            Enqueue(),
        ),
        # 8. drain: the head queued max_drain_wait_s (3 s) ago; models busy meanwhile are drained
        (
            {
                "free_gib": 2.0,
                "rules": DRAIN_3,
                "queued_since": NOW - 3,
                "others": (other("busy", 6, inflight=1, idle_for=1),),
            },
            Drain(("busy",)),
        ),
        (
            {"free_gib": 2.0, "rules": DRAIN_3, "queued_since": NOW - 3, "others": (other("between", 6, idle_for=1),)},
            Drain(("between",)),
        ),  # a gap between requests
        (
            {
                "free_gib": 2.0,
                "rules": DRAIN_3,
                "queued_since": NOW - 2.9,
                "others": (other("busy", 6, inflight=1, idle_for=1),),
            },
            Enqueue(),
        ),  # not waited long enough
        (
            {
                "free_gib": 2.0,
                "rules": DRAIN_3,
                "queued_since": NOW - 3,
                "others": (other("left_alone", 6, idle_for=10),),
            },
            Enqueue(),
        ),  # no traffic while it waited
        (
            {
                "free_gib": 2.0,
                "rules": DRAIN_3,
                "queued_since": NOW - 3,
                "others": (other("owed", 6, inflight=1, idle_for=1, owed=True),),
            },
            Enqueue(),
        ),
        (
            {
                "free_gib": 2.0,
                "rules": DRAIN_3,
                "queued_since": NOW - 3,
                "others": (other("busy", 3, inflight=1, idle_for=1),),
            },
            Enqueue(),
        ),  # not enough memory
        (
            {
                "free_gib": 2.0,
                "rules": DRAIN_3,
                "queued_since": NOW - 3,
                "others": (other("busy", 3, inflight=1, idle_for=1), other("idle", 3, idle_for=900)),
            },
            Drain(("idle", "busy")),
        ),  # an idle candidate and a busy model together
        (
            {
                "free_gib": 2.0,
                "rules": Rules(DEFAULT_TIMEOUT, MAX_AGE, 20.0, max_drain_wait_s=0),
                "queued_since": NOW - 1000,
                "others": (other("busy", 6, inflight=1, idle_for=1),),
            },
            Enqueue(),
        ),
        (
            {
                "free_gib": 2.0,
                "rules": DRAIN_3,
                "queue": ("h", "x"),
                "queued_since": NOW - 30,
                "others": (other("busy", 6, inflight=1, idle_for=1),),
            },
            Enqueue(),
        ),  # only the head drains
    ],
    ids=[
        "nobody_waits",
        "removed",
        "starting",
        "ready",
        "pending_switch",
        "backoff",
        "fits",
        "failed_fits",
        "asleep_wakes",
        "head_fits",
        "behind_head_nothing_freed",
        "behind_head_beside_reservation",
        "too_big",
        "too_big_behind_head",
        "too_big_within_grace",
        "too_big_grace_over",
        "too_big_after_own_victims",
        "behind_head_no_room_made",
        "behind_head_reservation_blocks",
        "settle",
        "settle_over_more_victims",
        "make_room_lru",
        "make_room_as_head",
        "victims_not_enough",
        "victim_busy",
        "victim_not_idle_long_enough",
        "victim_engine_running",
        "victim_measured_frees_more",
        "evict_0_fresh_victim",
        "evict_0_busy_not",
        "evict_0_engine_running_not",
        "drain_busy",
        "drain_between_requests",
        "drain_not_yet",
        "drain_not_untouched",
        "drain_not_owed",
        "drain_not_enough",
        "drain_with_idle",
        "drain_off",
        "drain_only_head",
    ],
)
def test_plan_attempt(overrides: dict[str, Any], expected: Step) -> None:
    """Every branch of the attempt's decision tree, from a snapshot alone."""
    assert plan_attempt(snap(**overrides)) == expected


def test_freed_for_head_counts_only_victims_that_gave_their_memory_back() -> None:
    """A victim still stopping holds its memory; a stopped one freed it for the head."""
    others = (other("gone", 3, state=State.STOPPED), other("stopping", 4, state=State.STOPPING))
    assert freed_for_head({"gone": 3, "stopping": 4}, others) == {0: 3}
    assert freed_for_head({"removed": 2}, others) == {0: 2}  # removed: no longer holds anything
    assert freed_for_head({"removed": 2}, others, (0, 1)) == {0: 2, 1: 2}  # (somewhere: kept on each)
    assert freed_for_head({}, others) == {}


def test_what_was_freed_for_the_head_is_kept_on_the_victims_devices() -> None:
    """A victim on device 1 freed device 1 for the head, not device 0."""
    others = (other("v1", 60, state=State.STOPPED, devices=(1,)), other("w", 40, state=State.STOPPED, devices=(0, 1)))
    assert freed_for_head({"v1": 60, "w": 40}, others, (0, 1)) == {0: 20, 1: 80}


TWO = (Room(0, 20, 80), Room(1, 20, 80))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # fits on one device: starts there (best fit), though another waits for the other device
        ({"rooms": (Room(0, 70, 80), Room(1, 30, 80)), "need": Need(20)}, Start(wake=False, devices=(1,))),
        # behind a head whose victim freed device 0: device 1 is still free for a later entry
        (
            {
                "rooms": (Room(0, 60, 80), Room(1, 60, 80)),
                "need": Need(60),
                "queue": ("h",),
                "head_victims": {"v": 60},
                "others": (other("v", 60, state=State.STOPPED, devices=(0,)),),
            },
            Start(wake=False, devices=(1,)),
        ),
        # the head: victims only on the device it will use (the idle model on device 1 is older)
        (
            {
                "rooms": TWO,
                "need": Need(60, 1, (0,)),
                "others": (other("old", 60, idle_for=900, devices=(1,)), other("new", 60, idle_for=400, devices=(0,))),
            },
            MakeRoom(("new",)),
        ),
        # larger than any device could give: does_not_fit, though 160 GiB in all
        (
            {"rooms": (Room(0, 80, 80), Room(1, 80, 80)), "need": Need(90), "free_gib": 160, "capacity_gib": 160},
            GiveUp(90, 80),
        ),
        # spans both: room on both is needed
        (
            {
                "rooms": (Room(0, 80, 80), Room(1, 40, 80)),
                "need": Need(120, 2),
                "others": (other("b", 40, devices=(1,)),),
            },
            MakeRoom(("b",)),
        ),
    ],
    ids=[
        "best_fit_device",
        "beside_a_reservation_on_another_device",
        "victims_on_its_device",
        "too_big_for_a_device",
        "spans_both",
    ],
)
def test_plan_attempt_on_several_devices(overrides: dict[str, Any], expected: Step) -> None:
    assert plan_attempt(snap(**overrides)) == expected


def test_is_idle_never_while_someone_waits_for_it() -> None:
    """A deployment with waiters is about to be used: never a victim, even when idle and asleep."""
    assert not check_idle(dep(state=State.ASLEEP), idle_track(waiting=1), None)
    assert not check_idle(dep(), idle_track(waiting=1), fresh_sample())
