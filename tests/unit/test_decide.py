"""The on-demand controller's pure decisions (dgxmm.controller.decide), table by table.

No I/O, no clock, no sleeps: every time is a plain number passed in. Expected values come from
the on-demand specification's controller rules, not from the code.
"""

from __future__ import annotations

from dataclasses import replace

from typing import Any

import pytest

from dgxmm.deploy.sampler import Sample
from dgxmm.records.deployment import Deployment, Mode, Role, State
from dgxmm.controller.decide import (
    Action,
    Track,
    evict_after,
    idle_expiry,
    kept_alive,
    is_idle,
    next_action,
    next_backoff,
)

NOW = 1000.0
DEFAULT_TIMEOUT = 300.0
MAX_AGE = 60.0


def dep(**overrides: Any) -> Deployment:
    """An on-demand model deployment, ready, using the default idle timeout unless overridden."""
    fields: dict[str, Any] = {
        "id": "d1",
        "name": "d1",
        "served_name": "d1",
        "engine": "command",
        "memory_gib": 10,
        "role": Role.MODEL,
        "mode": Mode.ON_DEMAND,
        "state": State.READY,
    }
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
    return is_idle(d, track, sample, NOW, default_timeout_s=DEFAULT_TIMEOUT, max_sample_age_s=MAX_AGE)


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
        "always_on",
        "mode_none",
        "role_system",
        "role_decider",
        "pending_mode",
        "planned",
        "starting",
        "stopping",
        "stopped",
        "failed",
        "inflight",
        "idle_just_under_default_timeout",
        "just_released",
        "idle_under_own_timeout",
        "no_sample",
        "sample_exactly_max_age",
        "sample_stale",
        "sample_running",
        "sample_waiting",
        "sample_running_fraction",
    ],
)
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
        "default_exact",
        "default_under",
        "default_over",
        "own_exact",
        "own_under",
        "own_longer_than_default",
        "own_shorter_exact",
        "own_shorter_under",
    ],
)
def test_is_idle_timeout_boundary(idle_timeout_s: float | None, idle_for: float, expected: bool) -> None:
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


@pytest.mark.parametrize("idle_for", [0.0, DEFAULT_TIMEOUT, 10.0**9])
def test_idle_timeout_0_is_never_idle_to_the_reaper_and_idle_to_make_room_at_once(idle_for: float) -> None:
    """``idle_timeout_s = 0`` (llama-swap's ``ttl: 0``): no expiry, never the reaper's; make-room's
    ``evict_after`` is 0 (the moment nothing is in flight), or ``evict_idle_s`` when set."""
    d, track, sample = dep(idle_timeout_s=0), idle_track(idle_since=NOW - idle_for), fresh_sample()
    assert not check_idle(d, track, sample) and idle_expiry(d, track, DEFAULT_TIMEOUT) is None
    rule = {"default_timeout_s": DEFAULT_TIMEOUT, "max_sample_age_s": MAX_AGE}
    assert evict_after(d, DEFAULT_TIMEOUT, None) == 0
    assert is_idle(d, track, sample, NOW, idle_for_s=evict_after(d, DEFAULT_TIMEOUT, None), **rule)
    assert is_idle(d, track, sample, NOW, idle_for_s=300.0, **rule) is (idle_for >= 300)
    assert not is_idle(d, idle_track(inflight=1), sample, NOW, idle_for_s=0.0, **rule)


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
        "ready_default",
        "asleep_default",
        "own_shorter",
        "own_longer",
        "inflight",
        "always_on",
        "mode_none",
        "stopped",
        "starting",
        "stopping",
        "failed",
        "planned",
    ],
)
def test_idle_expiry(dep_overrides: dict[str, Any], inflight: int, expected: float | None) -> None:
    """idle_since + its timeout for an on-demand ready/asleep deployment with no slot in flight;
    None when it cannot become a victim by waiting."""
    track = Track(idle_since=700.0, inflight=inflight)
    assert idle_expiry(dep(**dep_overrides), track, DEFAULT_TIMEOUT) == expected


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


@pytest.mark.parametrize(
    ("keep_alive_s", "idle_for", "expected"),
    [(None, DEFAULT_TIMEOUT, True), (30.0, 30.0, True), (30.0, 29.9, False), (3600.0, DEFAULT_TIMEOUT, False)],
    ids=["none_the_default", "keep_alive_exact", "keep_alive_under", "keep_alive_longer_than_default"],
)
def test_a_callers_keep_alive_is_the_idle_timeout_of_the_idle_period(
    keep_alive_s: float | None, idle_for: float, expected: bool
) -> None:
    track = replace(idle_track(idle_since=NOW - idle_for), keep_alive_s=keep_alive_s)
    assert check_idle(dep(), track, fresh_sample()) is expected
    expiry = idle_expiry(dep(), track, DEFAULT_TIMEOUT)
    assert expiry == track.idle_since + (keep_alive_s if keep_alive_s is not None else DEFAULT_TIMEOUT)


@pytest.mark.parametrize(
    ("current", "asked", "inflight", "expected"),
    [
        (None, 300.0, 1, 300.0),
        (None, 0.0, 1, 60.0),  # below the bounds: the least
        (None, 10**9, 1, 86400.0),  # above: the most
        (None, -1.0, 1, 0.0),  # negative: never for idleness (NEVER, as idle_timeout_s = 0)
        (None, float("inf"), 1, 0.0),  # (what the Ollama API reads a negative one as)
        (3600.0, -1.0, 2, 0.0),  # never is longer than any other caller's
        (0.0, 60.0, 2, 0.0),  # and is kept while its caller is in flight
        (0.0, 60.0, 1, 60.0),  # alone: its own
        (3600.0, 60.0, 2, 3600.0),  # never below what another caller in flight asked for
        (3600.0, 60.0, 1, 60.0),  # alone: its own
    ],
)
def test_kept_alive_is_within_the_bounds_and_never_below_another_in_flight(
    current: float | None, asked: float, inflight: int, expected: float
) -> None:
    assert kept_alive(current, asked, inflight, 60.0, 86400.0) == expected
