"""What each sleep level asks of vLLM and leaves held (deploy/sleeplevels.py), and how the budget
counts an asleep deployment and a wake (issue 52 item 2): a table, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from dgxmm.deploy.budget import MemoryBudget
from dgxmm.deploy.measured import MeasuredMemory
from dgxmm.deploy.placement import Need
from dgxmm.deploy.sleeplevels import CONTEXT_GIB, LEVELS, WakeStep, asleep_holds_gib, level_of
from dgxmm.records.deployment import Deployment, MemoryLimit, Mode, State
from dgxmm.settings import MemorySettings

GIB = 1024**3


def vllm(level: Any = None, weights: float | None = None, state: State = State.ASLEEP, gib: float = 20) -> Deployment:
    limit = MemoryLimit(
        flag="--gpu-memory-utilization", value="0.5", gib=gib, set_by="dgxmm", added=[], weights_gib=weights
    )
    return Deployment(
        id="v",
        name="v",
        served_name="v",
        engine="vllm",
        model="m",
        memory_gib=gib,
        state=state,
        mode=Mode.ON_DEMAND,
        sleep_mode=True,
        sleep_level=level,
        memory_limit=limit,
    )


def test_the_default_level_is_the_one_that_frees_memory_on_this_host() -> None:
    assert level_of(vllm(), unified=True) == 2  # level 1 keeps the weights in the same pool
    assert level_of(vllm(), unified=False) == 1  # the weights go to host memory, off the device
    assert level_of(vllm("kv"), unified=True) == "kv" and level_of(vllm(1), unified=True) == 1


def test_each_level_sleeps_and_wakes_as_vllm_documents() -> None:
    assert [LEVELS[level].sleep_path for level in (1, 2, "kv")] == [
        "/sleep?level=1",
        "/sleep?level=2",
        "/sleep?tags=kv_cache",
    ]
    assert LEVELS[1].wake == (WakeStep("/wake_up"),)
    # Level 2: the weights' memory, the weights read again in place, then the KV cache.
    assert LEVELS[2].wake == (
        WakeStep("/wake_up?tags=weights"),
        WakeStep("/collective_rpc", {"method": "reload_weights"}),
        WakeStep("/wake_up?tags=kv_cache"),
    )
    assert LEVELS["kv"].wake == (WakeStep("/wake_up?tags=kv_cache"),)


@pytest.mark.parametrize(
    ("level", "unified", "weights", "held"),
    [
        (1, False, 12.0, CONTEXT_GIB),  # weights in host RAM: off the GPU
        (1, True, 12.0, 12.0 + CONTEXT_GIB),  # host RAM is the same pool: only the KV cache freed
        (1, True, None, 20.0),  # weights not known: the whole declaration
        (2, True, 12.0, CONTEXT_GIB),
        (2, False, None, CONTEXT_GIB),  # nothing of the weights kept anywhere
        ("kv", False, 12.0, 12.0 + CONTEXT_GIB),
        ("kv", True, 12.0, 12.0 + CONTEXT_GIB),
        ("kv", True, 19.5, 20.0),  # never more than declared
        ("kv", True, None, 20.0),
    ],
)
def test_an_asleep_engine_is_estimated_to_hold_what_its_level_keeps(
    level: Any, unified: bool, weights: float | None, held: float
) -> None:
    assert asleep_holds_gib(vllm(level, weights), unified) == held


def test_the_budget_counts_a_reading_taken_asleep_over_the_estimate() -> None:
    measured = MeasuredMemory(Peaks())
    budget = MemoryBudget(
        MemorySettings(source="declared", capacity_gib=100),
        held=measured.held_gib,
        asleep=measured.asleep_gib,
    )
    ready = vllm(2, 12.0, State.READY)
    measured.record(ready, 18 * GIB)  # taken while it served: not what it holds asleep
    asleep = vllm(2, 12.0)
    assert budget.held_of(ready) == 20 and budget.held_of(asleep) == CONTEXT_GIB
    measured.record(asleep, int(2.5 * GIB))
    assert budget.held_of(asleep) == 2.5


def test_a_wake_needs_its_declaration_plus_the_margin_and_a_start_does_not() -> None:
    budget = MemoryBudget(MemorySettings(source="declared", capacity_gib=100, wake_margin_gib=3))
    assert budget.need_of(vllm(state=State.ASLEEP)) == Need(23.0)
    assert budget.need_of(vllm(state=State.STOPPED)) == Need(20.0)


class Peaks:
    def memory_peaks(self) -> dict[tuple[str, str], int]:
        return {}

    def put_memory_peak(self, deployment_id: str, config: str, peak_bytes: int) -> None:
        pass
