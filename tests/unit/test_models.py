"""The state machine's transition table."""

from __future__ import annotations

import itertools

from dgxmm.records.deployment import HOLDS_MEMORY, TRANSITIONS, Deployment, Mode, Role, State, can_transition


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(State)


def test_paths_the_deployer_takes() -> None:
    path = [
        State.STOPPED,
        State.STARTING,
        State.READY,
        State.ASLEEP,
        State.STARTING,
        State.READY,
        State.STOPPING,
        State.STOPPED,
    ]
    assert all(can_transition(a, b) for a, b in itertools.pairwise(path))
    assert can_transition(State.STARTING, State.FAILED)
    assert can_transition(State.FAILED, State.STARTING)
    assert can_transition(State.STARTING, State.STOPPING)


def test_forbidden_transitions() -> None:
    assert not can_transition(State.STOPPED, State.READY)
    assert not can_transition(State.STOPPED, State.STOPPING)
    assert not can_transition(State.READY, State.STARTING)
    assert not can_transition(State.STOPPING, State.READY)
    for state in State:
        assert not can_transition(state, state)


def test_memory_holders_and_fixed_deployments() -> None:
    assert HOLDS_MEMORY == {State.STARTING, State.READY, State.ASLEEP, State.STOPPING}
    base = {"id": "x", "name": "x", "served_name": "x", "engine": "command", "memory_gib": 1}
    assert Deployment(**base, mode=Mode.ALWAYS_ON).is_fixed
    assert Deployment(**base, mode=None).is_fixed
    assert not Deployment(**base, mode=Mode.ON_DEMAND).is_fixed
    assert Deployment(**base, mode=Mode.ON_DEMAND, role=Role.SYSTEM).is_fixed
