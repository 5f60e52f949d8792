"""Memory budget: declared accounting, measured sources, the fit check's numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxmm.deploy.budget import InsufficientMemory, MemoryBudget, Reading, read_meminfo
from dgxmm.records.deployment import Deployment, Mode, Role, State
from dgxmm.settings import MemorySettings


def dep(i: str, gib: float, state: State, mode: Mode = Mode.ON_DEMAND, role: Role = Role.MODEL) -> Deployment:
    return Deployment(id=i, name=i, served_name=i, engine="command", memory_gib=gib, state=state, mode=mode, role=role)


def test_declared_budget_counts_holders_and_fixed() -> None:
    budget = MemoryBudget(MemorySettings(source="declared", capacity_gib=100))
    deps = [
        dep("a", 30, State.READY, Mode.ALWAYS_ON),
        dep("s", 10, State.STARTING, role=Role.SYSTEM, mode=Mode.ALWAYS_ON),
        dep("o", 20, State.ASLEEP),
        dep("p", 15, State.STOPPING),
        dep("x", 50, State.STOPPED),
        dep("f", 50, State.FAILED),
    ]
    snap = budget.snapshot(deps)
    # The asleep one counts what its sleep level leaves held (level 2 on this pooled host: its
    # CUDA context, deploy/sleeplevels.py), not its 20 GiB.
    assert snap.held == 30 + 10 + 1 + 15 and snap.fixed == 40
    assert snap.capacity == 60 and snap.free == 100 - 56


def test_fit_check_raises_with_need_free_and_capacity() -> None:
    budget = MemoryBudget(MemorySettings(source="declared", capacity_gib=100))
    deps = [dep("a", 30, State.READY, Mode.ALWAYS_ON), dep("o", 50, State.READY)]
    budget.fit(dep("n", 20, State.STOPPED), deps)
    with pytest.raises(InsufficientMemory) as err:
        budget.fit(dep("n", 21, State.STOPPED), deps)
    assert (err.value.need, err.value.free, err.value.capacity) == (21, 20, 70)


def test_fit_excludes_the_deployment_itself() -> None:
    """An asleep deployment being woken already holds its memory."""
    budget = MemoryBudget(MemorySettings(source="declared", capacity_gib=10))
    asleep = dep("a", 8, State.ASLEEP)
    budget.fit(asleep, [asleep])


def test_measured_source_caps_what_is_free() -> None:
    reading = Reading(total=120, available=40)
    budget = MemoryBudget(MemorySettings(source="meminfo", reserve_gib=8), reader=lambda: reading)
    snap = budget.snapshot([dep("a", 10, State.READY)])
    assert snap.usable == 112
    assert snap.free == 32  # measured 40 - reserve 8, below 112 - 10 declared


def test_read_meminfo(tmp_path: Path) -> None:
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       134217728 kB\nMemFree: 1 kB\nMemAvailable:    67108864 kB\n")
    assert read_meminfo(path) == Reading(total=128, available=64)


def test_declared_needs_a_capacity() -> None:
    with pytest.raises(ValueError, match=r"capacity_gib \(or devices_gib\) is required"):
        MemorySettings(source="declared")
