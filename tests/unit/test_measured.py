"""Measured memory without engines (issue 29): readings, peaks and the warning per start, the
suggestion, what the budget counts, and the GPU memory NVML reports per process."""

from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import dataclass, field

import pytest

from dgxmm.deploy.measured import GIB, MeasuredMemory, config_key, suggestion
from dgxmm.deploy.runtimes.members import Members
from dgxmm.deploy.procmemory import gpu_bytes, host_bytes
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment, State


@dataclass
class Peaks:
    rows: dict[tuple[str, str], int] = field(default_factory=dict)

    def memory_peaks(self) -> dict[tuple[str, str], int]:
        return dict(self.rows)

    def put_memory_peak(self, deployment_id: str, config: str, peak_bytes: int) -> None:
        self.rows[(deployment_id, config)] = peak_bytes


def dep(state: State = State.READY, gib: float = 1.0, **kw: object) -> Deployment:
    return Deployment(id="d", name="d", served_name="d", engine="command", memory_gib=gib, state=state, **kw)


def test_readings_peaks_and_one_warning_per_start_once_ready() -> None:
    warned: list[float] = []
    peaks = Peaks()
    m = MeasuredMemory(peaks, warn=lambda d, gib: warned.append(round(gib, 2)))
    m.record(dep(State.STARTING), int(1.5 * GIB))  # still loading: no warning yet
    assert warned == [] and m.gib("d") == 1.5
    m.record(dep(), int(1.2 * GIB))
    m.record(dep(), int(1.3 * GIB))
    assert warned == [1.2] and m.peak_gib("d") == 1.5 and m.gib("d") == pytest.approx(1.3)
    assert m.held_gib(dep()) == pytest.approx(1.3) and m.held_gib(dep(gib=2)) == 2  # the larger of the two
    m.on_change(Change("state", dep(State.ASLEEP), old_state=State.READY))
    m.on_change(Change("state", dep(State.STARTING), old_state=State.ASLEEP))  # a wake: the same run
    assert m.gib("d") == pytest.approx(1.3)
    m.on_change(Change("state", dep(State.STOPPED), old_state=State.READY))
    assert m.gib("d") is None and m.peak_gib("d") is None and m.held_gib(dep()) == 1.0
    m.record(dep(State.STOPPED), GIB)  # a reading that comes in after the stop is dropped
    assert m.gib("d") is None
    m.on_change(Change("state", dep(State.STARTING), old_state=State.STOPPED))
    m.record(dep(), int(1.4 * GIB))
    assert warned == [1.2, 1.4]  # a new start, a new warning
    assert peaks.rows == {("d", config_key(dep())): int(1.5 * GIB)}


def test_the_suggestion_is_per_configuration_and_kept_across_restarts() -> None:
    peaks = Peaks()
    MeasuredMemory(peaks).record(dep(), int(0.45 * GIB))
    again = MeasuredMemory(peaks)  # dgxmm restarted: the store had it
    assert again.suggested_gib(dep()) == 0.5  # 0.45 GiB plus 10 %, up to 0.1 GiB
    assert again.suggested_gib(dep(args=["--ctx", "8192"])) is None  # another configuration
    again.on_change(Change("removed", dep()))
    assert again.suggested_gib(dep()) is None


@pytest.mark.parametrize(("peak_gib", "suggested"), [(0.45, 0.5), (1.0, 1.1), (1.01, 1.2), (10.0, 11.0)])
def test_a_suggestion_is_the_peak_with_a_margin_rounded_up(peak_gib: float, suggested: float) -> None:
    assert suggestion(int(peak_gib * GIB)) == suggested


def test_a_process_tree_is_measured_from_proc() -> None:
    """A child in a session of its own, as an engine runs (the test's own session leader may be
    outside this PID namespace, as in CI's container, so it is not the one measured)."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; b = b'x' * (32 << 20); sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        members = Members("unused", None)  # no cgroup: the session and its tree
        members.started(child.pid)
        usage = members.usage()
        assert usage.pids == (child.pid,) and usage.host_bytes >= 32 << 20
    finally:
        child.kill()
        child.wait()
    assert host_bytes(2**22 + 12345) == 0  # gone (or never was): nothing


def test_gpu_memory_is_counted_per_process_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's per-process lists (compute and graphics); a process in both counts once, other
    processes not at all, and a host without NVML has none."""

    @dataclass
    class Proc:
        pid: int
        usedGpuMemory: int | None  # NVML's name

    fake = types.SimpleNamespace(
        NVMLError=Exception,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetComputeRunningProcesses=lambda h: (
            [Proc(10, 3 * GIB), Proc(99, GIB)] if h == 0 else [Proc(11, GIB)]
        ),
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [Proc(10, 3 * GIB), Proc(11, None)] if h == 0 else [],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_bytes((10, 11)) == 4 * GIB
    assert gpu_bytes(()) == 0

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    assert gpu_bytes((10,)) == 0
