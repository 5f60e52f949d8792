"""The model list's ``status`` in llama.cpp's vocabulary (gateway/modelstatus.py), for every
state and phase a deployment can be in."""

from __future__ import annotations

import pytest

from dgxmm.gateway.modelstatus import llamacpp_status
from dgxmm.records.deployment import State

PHASES = (None, "idle", "sleeping", "serving", "failed", "queued", "starting_for_request")


@pytest.mark.parametrize("phase", PHASES)
def test_a_ready_engine_is_loaded_and_an_asleep_one_sleeping_whatever_the_phase(phase: str | None) -> None:
    assert llamacpp_status(State.READY, phase) == {"value": "loaded"}
    assert llamacpp_status(State.ASLEEP, phase) == {"value": "sleeping"}


@pytest.mark.parametrize("state", [State.STOPPED, State.PLANNED, State.STOPPING, State.FAILED])
@pytest.mark.parametrize("phase", ["queued", "starting_for_request"])
def test_a_model_a_request_waits_for_is_loading(state: State, phase: str) -> None:
    """Waiting for room or for the engine: the client's request will be answered by this start."""
    assert llamacpp_status(state, phase) == {"value": "loading"}


@pytest.mark.parametrize("phase", PHASES)
def test_starting_is_loading(phase: str | None) -> None:
    assert llamacpp_status(State.STARTING, phase) == {"value": "loading"}


def test_a_stopped_model_is_unloaded_dgxmm_s_sleeping_phase_included() -> None:
    """dgxmm's phase "sleeping" is a stopped on-demand model, llama.cpp's "unloaded"."""
    for state in (State.STOPPED, State.PLANNED, State.STOPPING):
        for phase in (None, "sleeping", "idle"):
            assert llamacpp_status(state, phase) == {"value": "unloaded"}


def test_a_failed_start_is_unloaded_and_failed_as_llama_cpp_tells_it() -> None:
    assert llamacpp_status(State.FAILED, "failed") == {"value": "unloaded", "failed": True}
    assert llamacpp_status(State.FAILED, None) == {"value": "unloaded", "failed": True}
