"""The on-demand controller's pure decisions (dgxmm.ondemand.decide), table by table.

No I/O, no clock, no sleeps: every time is a plain number passed in. Expected values come from
the spec (ondemand-gateway.md, "Controller"), not from the code.
"""

from __future__ import annotations

from typing import Any

import pytest

from dgxmm.deploy.metrics import Sample
from dgxmm.deploy.models import Deployment, Mode, Role, State
from dgxmm.ondemand.decide import (
    Abandon,
    Action,
    AttemptSnapshot,
    Candidate,
    Enqueue,
    GiveUp,
    MakeRoom,
    Moot,
    Other,
    Phase,
    Progress,
    Rules,
    Settle,
    Start,
    Step,
    Track,
    freed_for_head,
    idle_expiry,
    is_idle,
    may_start_behind_head,
    next_action,
    next_backoff,
    phase,
    pick_victims,
    plan_attempt,
)

NOW = 1000.0
DEFAULT_TIMEOUT = 300.0
MAX_AGE = 60.0


def dep(**overrides: Any) -> Deployment:
    """An on-demand model deployment, ready, using the default idle timeout unless overridden."""
    fields: dict[str, Any] = {
        "id": "d1", "name": "d1", "served_name": "d1", "engine": "command", "memory_gib": 10,
        "role": Role.MODEL, "mode": Mode.ON_DEMAND, "state": State.READY,
    }  # fmt: skip
    fields.update(overrides)
    return Deployment(**fields)


# --- next_action ----------------------------------------------------------------------------------

# How the deployment is configured: whether the controller may start it itself.
VARIANTS: dict[str, dict[str, Any]] = {
    "on_demand": {},
    "always_on": {"mode": Mode.ALWAYS_ON},
    "mode_none": {"mode": None},  # NULL reads as always_on
    "pending_mode": {"pending_mode": Mode.ALWAYS_ON},  # set_mode is starting it
    "role_system": {"role": Role.SYSTEM},
    "role_decider": {"role": Role.DECIDER},
}


def expected_action(state: State, variant: str, in_backoff: bool) -> Action:
    """The spec's rule, written independently of the code."""
    if state is State.READY:
        return Action.GRANT
    if variant != "on_demand":
        return Action.WAIT
    if state in (State.STOPPED, State.FAILED):
        return Action.REFUSE if in_backoff else Action.START
    if state is State.ASLEEP:
        return Action.WAKE
    return Action.WAIT  # starting, stopping, planned


@pytest.mark.parametrize("in_backoff", [False, True], ids=["no_backoff", "backoff"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("state", list(State), ids=[s.value for s in State])
def test_next_action_table(state: State, variant: str, in_backoff: bool) -> None:
    """Every state x configuration x backoff: ready GRANT; stopped/failed START or REFUSE in
    backoff; asleep WAKE; anything else, or not startable by the controller, WAIT."""
    track = Track(idle_since=0.0, refused_until=NOW + 30 if in_backoff else 0.0)
    result = next_action(dep(state=state, **VARIANTS[variant]), track, NOW)
    assert result is expected_action(state, variant, in_backoff)


@pytest.mark.parametrize(
    ("refused_until", "expected"),
    [
        (NOW + 0.001, Action.REFUSE),  # still refusing
        (NOW, Action.START),  # backoff ends exactly now: now < refused_until is false
        (NOW - 0.001, Action.START),  # over
        (0.0, Action.START),  # never failed
    ],
    ids=["just_before_end", "exactly_at_end", "just_after_end", "never_failed"],
)
@pytest.mark.parametrize("state", [State.STOPPED, State.FAILED], ids=["stopped", "failed"])
def test_next_action_backoff_boundary(state: State, refused_until: float, expected: Action) -> None:
    """A start is refused only while now < refused_until."""
    track = Track(idle_since=0.0, refused_until=refused_until)
    assert next_action(dep(state=state), track, NOW) is expected


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_next_action_backoff_never_refuses_a_ready_deployment(variant: str) -> None:
    """Ready is GRANT even in start-failure backoff."""
    track = Track(idle_since=0.0, refused_until=NOW + 900)
    assert next_action(dep(state=State.READY, **VARIANTS[variant]), track, NOW) is Action.GRANT


@pytest.mark.parametrize("variant", ["pending_mode", "always_on", "role_system"])
def test_next_action_backoff_does_not_refuse_a_deployment_the_controller_does_not_start(
    variant: str,
) -> None:
    """A stopped deployment the controller must not start waits, even in backoff (no REFUSE)."""
    track = Track(idle_since=0.0, refused_until=NOW + 900)
    result = next_action(dep(state=State.STOPPED, **VARIANTS[variant]), track, NOW)
    assert result is Action.WAIT


# --- is_idle --------------------------------------------------------------------------------------


def idle_track(**overrides: Any) -> Track:
    """Idle for exactly the default timeout, nothing in flight."""
    fields: dict[str, Any] = {"idle_since": NOW - DEFAULT_TIMEOUT}
    fields.update(overrides)
    return Track(**fields)


def fresh_sample(**overrides: Any) -> Sample:
    fields: dict[str, Any] = {"time": NOW - 10, "running": 0, "waiting": 0}
    fields.update(overrides)
    return Sample(**fields)


def check_idle(d: Deployment, track: Track | None, sample: Sample | None) -> bool:
    return is_idle(d, track, sample, NOW, default_timeout_s=DEFAULT_TIMEOUT,
                   max_sample_age_s=MAX_AGE)  # fmt: skip


def test_is_idle_baseline() -> None:
    """Ready, on demand, idle for the full timeout, fresh sample showing nothing: idle."""
    assert check_idle(dep(), idle_track(), fresh_sample())


@pytest.mark.parametrize(
    ("dep_overrides", "track_overrides", "sample"),
    [
        ({"mode": Mode.ALWAYS_ON}, {}, fresh_sample()),
        ({"mode": None}, {}, fresh_sample()),
        ({"role": Role.SYSTEM}, {}, fresh_sample()),
        ({"role": Role.DECIDER}, {}, fresh_sample()),
        ({"pending_mode": Mode.ALWAYS_ON}, {}, fresh_sample()),
        ({"state": State.PLANNED}, {}, fresh_sample()),
        ({"state": State.STARTING}, {}, fresh_sample()),
        ({"state": State.STOPPING}, {}, fresh_sample()),
        ({"state": State.STOPPED}, {}, fresh_sample()),
        ({"state": State.FAILED}, {}, fresh_sample()),
        ({}, {"inflight": 1}, fresh_sample()),
        ({}, {"idle_since": NOW - DEFAULT_TIMEOUT + 0.001}, fresh_sample()),
        ({}, {"idle_since": NOW}, fresh_sample()),
        ({"idle_timeout_s": 600}, {}, fresh_sample()),  # own timeout longer than the default
        ({}, {}, None),
        ({}, {}, fresh_sample(time=NOW - MAX_AGE)),  # exactly max age: not "less than 60 s old"
        ({}, {}, fresh_sample(time=NOW - 500)),
        ({}, {}, fresh_sample(running=1)),
        ({}, {}, fresh_sample(waiting=1)),
        ({}, {}, fresh_sample(running=0.5)),  # a gauge, not necessarily an integer
    ],
    ids=[
        "always_on", "mode_none", "role_system", "role_decider", "pending_mode",
        "planned", "starting", "stopping", "stopped", "failed",
        "inflight", "idle_just_under_default_timeout", "just_released",
        "idle_under_own_timeout", "no_sample", "sample_exactly_max_age", "sample_stale",
        "sample_running", "sample_waiting", "sample_running_fraction",
    ],
)  # fmt: skip
def test_is_idle_each_condition_alone_prevents(
    dep_overrides: dict[str, Any], track_overrides: dict[str, Any], sample: Sample | None
) -> None:
    """Breaking any one rule of the victim/reaper check makes the deployment not idle."""
    assert not check_idle(dep(**dep_overrides), idle_track(**track_overrides), sample)


def test_is_idle_without_track_is_not_idle() -> None:
    """A deployment the controller has no track of is never a victim."""
    assert not check_idle(dep(), None, fresh_sample())


@pytest.mark.parametrize(
    ("idle_timeout_s", "idle_for", "expected"),
    [
        (None, DEFAULT_TIMEOUT, True),  # exactly the default timeout counts as idle
        (None, DEFAULT_TIMEOUT - 0.5, False),
        (None, DEFAULT_TIMEOUT + 100, True),
        (600.0, 600.0, True),  # exactly its own timeout
        (600.0, 599.5, False),
        (600.0, DEFAULT_TIMEOUT, False),  # the default is not used when it has its own
        (120.0, 120.0, True),  # its own shorter timeout wins over the default
        (120.0, 119.5, False),
    ],
    ids=[
        "default_exact", "default_under", "default_over", "own_exact", "own_under",
        "own_longer_than_default", "own_shorter_exact", "own_shorter_under",
    ],
)  # fmt: skip
def test_is_idle_timeout_boundary(
    idle_timeout_s: float | None, idle_for: float, expected: bool
) -> None:
    """Idle for exactly the (per-deployment or default) timeout counts as idle; less does not."""
    d = dep(idle_timeout_s=idle_timeout_s)
    assert check_idle(d, idle_track(idle_since=NOW - idle_for), fresh_sample()) is expected


@pytest.mark.parametrize(
    ("age", "expected"),
    [(0.0, True), (MAX_AGE - 0.001, True), (MAX_AGE, False), (MAX_AGE + 0.001, False)],
    ids=["new", "just_under_max_age", "exactly_max_age", "just_over_max_age"],
)
def test_is_idle_sample_age_boundary(age: float, expected: bool) -> None:
    """Only a sample less than max age old counts as fresh (spec: "less than 60 s old")."""
    assert check_idle(dep(), idle_track(), fresh_sample(time=NOW - age)) is expected


@pytest.mark.parametrize(
    "sample",
    [None, fresh_sample(time=NOW - 500), fresh_sample(time=NOW - MAX_AGE)],
    ids=["no_sample", "stale_sample", "sample_exactly_max_age"],
)
def test_is_idle_asleep_needs_no_sample(sample: Sample | None) -> None:
    """An asleep engine is not sampled: idle for its timeout is enough."""
    assert check_idle(dep(state=State.ASLEEP), idle_track(), sample)


@pytest.mark.parametrize(
    ("dep_overrides", "track_overrides"),
    [
        ({}, {"inflight": 1}),
        ({}, {"idle_since": NOW - DEFAULT_TIMEOUT + 1}),
        ({"pending_mode": Mode.ALWAYS_ON}, {}),
        ({"mode": Mode.ALWAYS_ON}, {}),
        ({"role": Role.SYSTEM}, {}),
    ],
    ids=["inflight", "not_idle_long_enough", "pending_mode", "always_on", "role_system"],
)
def test_is_idle_asleep_still_needs_the_other_rules(
    dep_overrides: dict[str, Any], track_overrides: dict[str, Any]
) -> None:
    """Asleep skips only the sample rule."""
    d = dep(state=State.ASLEEP, **dep_overrides)
    assert not check_idle(d, idle_track(**track_overrides), None)


# --- idle_expiry ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dep_overrides", "inflight", "expected"),
    [
        ({}, 0, 700.0 + DEFAULT_TIMEOUT),
        ({"state": State.ASLEEP}, 0, 700.0 + DEFAULT_TIMEOUT),
        ({"idle_timeout_s": 90.0}, 0, 790.0),
        ({"idle_timeout_s": 3600.0}, 0, 4300.0),
        ({}, 1, None),
        ({"mode": Mode.ALWAYS_ON}, 0, None),
        ({"mode": None}, 0, None),
        ({"state": State.STOPPED}, 0, None),
        ({"state": State.STARTING}, 0, None),
        ({"state": State.STOPPING}, 0, None),
        ({"state": State.FAILED}, 0, None),
        ({"state": State.PLANNED}, 0, None),
    ],
    ids=[
        "ready_default", "asleep_default", "own_shorter", "own_longer", "inflight",
        "always_on", "mode_none", "stopped", "starting", "stopping", "failed", "planned",
    ],
)  # fmt: skip
def test_idle_expiry(dep_overrides: dict[str, Any], inflight: int, expected: float | None) -> None:
    """idle_since + its timeout for an on-demand ready/asleep deployment with no slot in flight;
    None when it cannot become a victim by waiting."""
    track = Track(idle_since=700.0, inflight=inflight)
    assert idle_expiry(dep(**dep_overrides), track, DEFAULT_TIMEOUT) == expected


# --- pick_victims ---------------------------------------------------------------------------------


def cand(id: str, gib: float, idle_since: float) -> Candidate:
    return Candidate(id=id, memory_gib=gib, idle_since=idle_since)


@pytest.mark.parametrize(
    ("candidates", "shortfall", "expected"),
    [
        # least recently used first, whatever the input order
        ([cand("c", 10, 3), cand("a", 10, 1), cand("b", 10, 2)], 30, ["a", "b", "c"]),
        # stops as soon as the shortfall is covered
        ([cand("c", 10, 3), cand("a", 10, 1), cand("b", 10, 2)], 15, ["a", "b"]),
        ([cand("c", 10, 3), cand("a", 10, 1), cand("b", 10, 2)], 5, ["a"]),
        # LRU, not best fit: the older small one goes first even though the big one alone fits
        ([cand("old", 5, 1), cand("new", 50, 2)], 10, ["old", "new"]),
        # ties on idle_since are broken by id
        ([cand("b", 10, 1), cand("a", 10, 1), cand("c", 10, 1)], 15, ["a", "b"]),
        ([cand("z", 10, 1), cand("y", 10, 2), cand("x", 10, 2)], 25, ["z", "x", "y"]),
        # exact cover: covered by the first, nothing more
        ([cand("a", 10, 1), cand("b", 10, 2)], 10, ["a"]),
        # exact cover with all of them
        ([cand("a", 10, 1), cand("b", 10, 2)], 20, ["a", "b"]),
        # exact cover despite binary floating point (0.1 + 0.2 != 0.3)
        ([cand("a", 0.1, 1), cand("b", 0.2, 2)], 0.3, ["a", "b"]),
        # all together are not enough: stop nobody
        ([cand("a", 10, 1), cand("b", 10, 2)], 20.5, None),
        ([cand("a", 10, 1)], 1000, None),
        # no candidates
        ([], 10, None),
        ([], 0, []),
        # nothing missing: stop nobody
        ([cand("a", 10, 1)], 0, []),
        ([cand("a", 10, 1)], -5, []),
        ([], -5, []),
    ],
    ids=[
        "lru_order", "stop_when_covered_two", "stop_when_covered_one", "lru_not_best_fit",
        "tie_by_id", "tie_by_id_after_lru", "exact_cover_first", "exact_cover_all",
        "exact_cover_float", "not_enough_by_a_little", "not_enough_single", "empty_positive",
        "empty_zero", "zero_shortfall", "negative_shortfall", "empty_negative",
    ],
)  # fmt: skip
def test_pick_victims(
    candidates: list[Candidate], shortfall: float, expected: list[str] | None
) -> None:
    """Least recently used first (ties by id) until the shortfall is covered; None if all of
    them together are not enough."""
    assert pick_victims(candidates, shortfall) == expected


def test_pick_victims_accepts_any_iterable() -> None:
    """Candidates may come from a generator (consumed once)."""
    gen = (c for c in [cand("b", 10, 2), cand("a", 10, 1)])
    assert pick_victims(gen, 15) == ["a", "b"]


# --- may_start_behind_head ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("need", "free", "reserved", "expected"),
    [
        (10, 20, 0, True),
        (20, 20, 0, True),  # exactly what is free
        (20.001, 20, 0, False),
        (10, 20, 10, True),  # exactly free minus the head's reserve
        (10.001, 20, 10, False),
        (15, 20, 10, False),  # would fit in free memory, but not without the head's reserve
        (0.3, 0.1 + 0.2, 0, True),  # floating point exactness
        (0, 5, 10, False),  # reserve exceeds free: nothing may start
        (1, 0, 0, False),
    ],
    ids=[
        "fits", "fits_exactly", "over_by_a_little", "fits_exactly_with_reserve",
        "over_reserve_by_a_little", "only_fits_without_reserve", "float_exact",
        "reserve_exceeds_free", "nothing_free",
    ],
)  # fmt: skip
def test_may_start_behind_head(need: float, free: float, reserved: float, expected: bool) -> None:
    """A later entry starts only if it fits in free memory minus what was freed for the head."""
    assert may_start_behind_head(need, free, reserved) is expected


# --- next_backoff ---------------------------------------------------------------------------------


def test_next_backoff_sequence() -> None:
    """60, 120, 240, 480, 900, 900 with initial 60 s and max 900 s."""
    seq, current = [], 0.0
    for _ in range(6):
        current = next_backoff(current, 60.0, 900.0)
        seq.append(current)
    assert seq == [60, 120, 240, 480, 900, 900]


@pytest.mark.parametrize(
    ("current", "expected"),
    [(0, 60), (-1, 60), (60, 120), (120, 240), (240, 480), (480, 900), (450, 900), (900, 900)],
    ids=["none_yet", "negative", "60", "120", "240", "480_capped", "450_capped", "max"],
)
def test_next_backoff_step(current: float, expected: float) -> None:
    """No backoff yet gives the initial period; otherwise double, capped at the maximum."""
    assert next_backoff(current, 60.0, 900.0) == expected


def test_next_backoff_initial_above_max_is_capped() -> None:
    """The maximum caps even the first period."""
    assert next_backoff(0, 60.0, 30.0) == 30.0


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
        (State.STARTING, trk(inflight=1, started_for_request=True), False,
         Phase.STARTING_FOR_REQUEST),
        # starting without started_for_request (by hand) is not starting_for_request
        (State.STARTING, trk(), False, Phase.IDLE),
        (State.STARTING, trk(inflight=1), False, Phase.SERVING),
        (State.STARTING, None, False, Phase.IDLE),
        # started_for_request only counts while starting
        (State.READY, trk(started_for_request=True), False, Phase.IDLE),
        (State.READY, trk(inflight=1, started_for_request=True), False, Phase.SERVING),
        (State.FAILED, trk(started_for_request=True), False, Phase.FAILED),
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
        "q_stopped", "q_and_serving", "q_and_starting_for_request", "q_and_sfr_and_serving",
        "q_failed", "q_removed", "q_no_track",
        "sfr", "sfr_over_serving",
        "starting_by_hand_idle", "starting_by_hand_serving", "starting_no_track",
        "ready_sfr_flag_idle", "ready_sfr_flag_serving", "failed_sfr_flag", "removed_sfr_flag",
        "serving", "serving_over_failed", "serving_over_removed", "serving_over_stopping",
        "failed", "failed_no_track", "removed", "removed_no_track",
        "stopped", "asleep", "stopping", "stopped_no_track", "asleep_sfr_flag",
        "ready_idle", "ready_no_track", "planned_idle",
    ],
)  # fmt: skip
def test_phase_precedence(
    state: State | None, track: Track | None, queued: bool, expected: Phase
) -> None:
    """queued > starting_for_request > serving > failed (or removed) > sleeping > idle."""
    d = None if state is None else dep(state=state)
    assert phase(d, track, queued) is expected


def test_phase_values_are_the_spec_strings() -> None:
    """status() exposes phase.value; the strings are the spec's."""
    assert [p.value for p in Phase] == [
        "queued", "starting_for_request", "serving", "failed", "sleeping", "idle",
    ]  # fmt: skip


# --- plan_attempt ---------------------------------------------------------------------------------

RULES = Rules(idle_timeout_s=DEFAULT_TIMEOUT, metrics_max_age_s=MAX_AGE, stop_settle_s=20.0)


def other(id: str, gib: float, *, idle_for: float = DEFAULT_TIMEOUT, state: State = State.READY,
          inflight: int = 0, sample: Sample | None = None) -> Other:  # fmt: skip
    """Another on-demand deployment, idle for ``idle_for`` with a fresh idle sample."""
    d = dep(id=id, name=id, memory_gib=gib, state=state)
    return Other(d, Track(idle_since=NOW - idle_for, inflight=inflight), sample or fresh_sample())


def snap(**overrides: Any) -> AttemptSnapshot:
    """x (6 GiB, stopped) with one waiter, an empty queue, 10 GiB free of 10 GiB capacity."""
    fields: dict[str, Any] = {
        "deployment_id": "x", "dep": dep(id="x", name="x", memory_gib=6, state=State.STOPPED),
        "track": Track(idle_since=0.0), "waiters": 1, "now": NOW, "queue": (), "head_victims": {},
        "free_gib": 10.0, "capacity_gib": 10.0, "others": (), "last_stop": -1e9,
        "progress": Progress(), "rules": RULES,
    }  # fmt: skip
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
        ({}, Start(wake=False)),
        ({"dep": dep(id="x", memory_gib=6, state=State.FAILED)}, Start(wake=False)),
        ({"dep": dep(id="x", memory_gib=6, state=State.ASLEEP)}, Start(wake=True)),
        ({"queue": ("x", "y")}, Start(wake=False)),  # the head
        ({"queue": ("h",), "free_gib": 6.0}, Start(wake=False)),  # behind a head that freed nothing
        # ... behind the head, beside what was freed for it (h's victim v is stopped: 3 freed)
        ({"queue": ("h",), "free_gib": 9.0, "head_victims": {"v": 3.0},
          "others": (other("v", 3, state=State.STOPPED),)}, Start(wake=False)),
        # 4. more than the capacity: give up, unless within the grace or after its own victims
        ({"free_gib": 2.0, "capacity_gib": 5.0}, GiveUp(6, 5.0)),
        ({"free_gib": 2.0, "capacity_gib": 5.0, "queue": ("h",)}, GiveUp(6, 5.0)),  # behind a head too
        ({"free_gib": 2.0, "capacity_gib": 5.0, "last_stop": NOW - 19.9}, Enqueue()),
        ({"free_gib": 2.0, "capacity_gib": 5.0, "last_stop": NOW - 20.0}, GiveUp(6, 5.0)),
        ({"free_gib": 2.0, "capacity_gib": 5.0, "progress": Progress(stopped_victim=True)}, Enqueue()),
        # 5. behind the head: queue, even when idle victims exist (only the head makes room)
        ({"queue": ("h",), "free_gib": 2.0, "others": (other("v", 6),)}, Enqueue()),
        # ... and when it fits in free memory but not beside the head's freed reservation
        ({"queue": ("h",), "free_gib": 8.0, "head_victims": {"v": 3.0},
          "others": (other("v", 3, state=State.STOPPED),)}, Enqueue()),
        # 6. the head whose victims were just stopped: settle until the deadline, then look again
        ({"free_gib": 2.0, "progress": Progress(True, settle_until=NOW + 5)}, Settle(NOW + 5)),
        ({"free_gib": 2.0, "progress": Progress(True, settle_until=NOW), "others": (other("v", 4),)},
         MakeRoom(("v",))),
        # 7. make room: least recently used first until covered
        ({"free_gib": 2.0, "others": (other("new", 3, idle_for=400), other("old", 3, idle_for=900),
                                       other("mid", 3, idle_for=600))}, MakeRoom(("old", "mid"))),
        ({"free_gib": 2.0, "queue": ("x",), "others": (other("v", 4),)}, MakeRoom(("v",))),
        # 8. victims not enough (or none idle): queue, stopping nobody
        ({"free_gib": 2.0, "others": (other("v", 3),)}, Enqueue()),
        ({"free_gib": 2.0, "others": (other("busy", 6, inflight=1),)}, Enqueue()),
        ({"free_gib": 2.0, "others": (other("fresh", 6, idle_for=10),)}, Enqueue()),
        ({"free_gib": 2.0, "others": (other("running", 6, sample=fresh_sample(running=1)),)}, Enqueue()),
    ],
    ids=[
        "nobody_waits", "removed", "starting", "ready", "pending_switch", "backoff",
        "fits", "failed_fits", "asleep_wakes", "head_fits", "behind_head_nothing_freed",
        "behind_head_beside_reservation",
        "too_big", "too_big_behind_head", "too_big_within_grace", "too_big_grace_over",
        "too_big_after_own_victims",
        "behind_head_no_room_made", "behind_head_reservation_blocks",
        "settle", "settle_over_more_victims",
        "make_room_lru", "make_room_as_head",
        "victims_not_enough", "victim_busy", "victim_not_idle_long_enough", "victim_engine_running",
    ],
)  # fmt: skip
def test_plan_attempt(overrides: dict[str, Any], expected: Step) -> None:
    """Every branch of the attempt's decision tree, from a snapshot alone."""
    assert plan_attempt(snap(**overrides)) == expected


def test_freed_for_head_counts_only_victims_that_gave_their_memory_back() -> None:
    """A victim still stopping holds its memory; a stopped one freed it for the head."""
    others = (other("gone", 3, state=State.STOPPED), other("stopping", 4, state=State.STOPPING))
    assert freed_for_head({"gone": 3, "stopping": 4}, others) == 3
    assert freed_for_head({"removed": 2}, others) == 2  # removed: no longer holds anything
    assert freed_for_head({}, others) == 0


def test_is_idle_never_while_someone_waits_for_it() -> None:
    """A deployment with waiters is about to be used: never a victim, even when idle and asleep."""
    assert not check_idle(dep(state=State.ASLEEP), idle_track(waiting=1), None)
    assert not check_idle(dep(), idle_track(waiting=1), fresh_sample())
