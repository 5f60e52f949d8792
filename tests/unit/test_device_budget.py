"""A host's devices in the memory budget, and what an engine is told of its devices (issue 35).

NVML is replaced by a stand-in for nvidia-ml-py's ``pynvml`` that answers its documented
functions (``nvmlInit``, ``nvmlShutdown``, ``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``,
``nvmlDeviceGetName``, ``nvmlDeviceGetUUID``, ``nvmlDeviceGetMemoryInfo``, ``NVMLError``): what
dgxmm reads of it and how, not what a real driver answers (that needs a GPU)."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dgxmm.deploy import budget as budget_module
from dgxmm.deploy.budget import GIB, InsufficientMemory, MemoryBudget, Reading
from dgxmm.deploy.engines import ENGINES
from dgxmm.deploy.gpus import visible_devices
from dgxmm.deploy.limits import EngineLimits
from dgxmm.deploy.runtimes.docker import DockerRuntime
from dgxmm.records.deployment import Deployment, Mode, State
from dgxmm.settings import EngineSettings, MemorySettings

TWO = MemorySettings(source="declared", devices_gib=[80, 80])


def dep(i: str, gib: float, state: State = State.READY, **kw: Any) -> Deployment:
    return Deployment(
        id=i, name=i, served_name=i, engine="command", memory_gib=gib, state=state, mode=Mode.ON_DEMAND, **kw
    )


def test_declared_devices_each_have_an_account() -> None:
    budget = MemoryBudget(TWO)
    deps = [
        dep("a", 60, placed_on=[0]),
        dep("b", 30, placed_on=[1]),
        dep("w", 20, gpus=2, placed_on=[0, 1]),
        dep("off", 50, State.STOPPED, placed_on=[1]),
    ]
    snap = budget.snapshot(deps)
    assert [(a.index, a.total, a.held, a.free) for a in snap.devices] == [(0, 80, 70, 10), (1, 80, 40, 40)]
    assert (snap.usable, snap.held, snap.free) == (160, 110, 50)
    assert not budget.pooled and budget.count_of(deps[2]) == 2


def test_the_fit_check_places_on_the_best_fit_and_refuses_what_fits_no_device() -> None:
    budget = MemoryBudget(TWO)
    deps = [dep("a", 60, placed_on=[0]), dep("b", 30, placed_on=[1])]
    assert budget.fit(dep("n", 15, State.STOPPED), deps) == (0,)  # 20 free there, 50 on device 1
    assert budget.fit(dep("n", 40, State.STOPPED), deps) == (1,)
    with pytest.raises(InsufficientMemory) as err:
        budget.fit(dep("n", 55, State.STOPPED), deps)  # 70 free in all, 50 at most on one
    assert "needs 55 GiB on each of the devices it may use; the most free on one device is 50.0 GiB" in str(err.value)
    with pytest.raises(InsufficientMemory):
        budget.fit(dep("n", 15, State.STOPPED), deps, devices=(1, 0))  # not a set it may use (gpus = 1)
    assert budget.fit(dep("cpu", 500, State.STOPPED, gpus=0), deps) == ()  # holds nothing on a device


def test_where_an_engine_holds_memory() -> None:
    budget = MemoryBudget(TWO)
    assert budget.devices_of(dep("a", 1, placed_on=[1])) == (1,)
    assert budget.devices_of(dep("a", 1, gpu_ids=[1])) == (1,)  # not placed yet: its pin
    assert budget.devices_of(dep("a", 1, gpus=2)) == (0, 1)  # told nothing: CUDA's first devices
    assert budget.devices_of(dep("a", 1, placed_on=[7])) == (0,)  # a device that went away
    assert budget.devices_of(dep("a", 1, gpus=0)) == ()
    pooled = MemoryBudget(MemorySettings(capacity_gib=100))
    assert (
        pooled.pooled and pooled.devices_of(dep("a", 1, gpus=4)) == (0,) and pooled.count_of(dep("a", 1, gpus=4)) == 1
    )


class Memory:
    def __init__(self, total: float, free: float) -> None:
        self.total, self.free, self.used = int(total * GIB), int(free * GIB), int((total - free) * GIB)


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def stand_in(memory: dict[int, Memory | None]) -> types.SimpleNamespace:
    """``pynvml`` with the devices in ``memory`` (None: NOT_SUPPORTED, as a GB10 answers)."""

    def info(handle: int) -> Memory:
        found = memory[handle]
        if found is None:
            raise NVMLError(3)
        return found

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_ERROR_NOT_SUPPORTED=3,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(memory),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: f"NVIDIA H100 #{h}".encode(),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=info,
    )


def test_nvml_gives_one_account_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in({0: Memory(80, 70), 1: Memory(80, 20)}))
    budget = MemoryBudget(MemorySettings(source="nvml", reserve_gib=2))
    assert [(d.index, d.name, d.total_gib) for d in budget.devices()] == [
        (0, "NVIDIA H100 #0", 80),
        (1, "NVIDIA H100 #1", 80),
    ]
    snap = budget.snapshot([dep("a", 10, placed_on=[1])])
    assert [(a.usable, a.held, a.free) for a in snap.devices] == [(78, 0, 68), (78, 10, 18)]  # measured free wins
    assert budget.fit(dep("n", 30, State.STOPPED), []) == (0,)
    assert not budget.pooled and budget.device_total(1) == 80


def test_a_gb10_that_does_not_report_its_memory_is_sized_from_meminfo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in({0: None}))
    monkeypatch.setattr(budget_module, "_warned_unified", set())
    host = Reading(total=119.7, available=100.0)
    with caplog.at_level(logging.WARNING, logger=budget_module.__name__):
        found = budget_module.read_nvml(lambda: host)
        budget_module.read_nvml(lambda: host)
    assert found == (Reading(119.7, 100.0, 0, "NVIDIA H100 #0"),)
    assert len(caplog.records) == 1 and "unified memory" in caplog.records[0].getMessage()


def test_a_vllm_share_is_of_the_device_it_runs_on() -> None:
    budget = MemoryBudget(TWO)
    limits = EngineLimits(budget.device_total, EngineSettings(), spans=budget.count_of)
    one = Deployment(id="v", name="v", served_name="v", engine="vllm", model="m", memory_gib=40)
    assert limits.resolve(one).value == "0.5"  # of one 80 GiB device, not of the 160 in all
    wide = one.model_copy(update={"memory_gib": 120, "gpus": 2, "placed_on": [0, 1]})
    limit = limits.resolve(wide)
    assert (limit.value, limit.gib) == ("0.75", 120)
    wide = wide.model_copy(update={"memory_limit": limit})
    argv = ENGINES["vllm"].argv(wide, 7, EngineSettings(vllm_python="py"))
    assert argv[-4:] == ["--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.75"]
    own = wide.model_copy(update={"args": ["-tp", "2"]})
    assert "--tensor-parallel-size" not in ENGINES["vllm"].argv(own, 7, EngineSettings(vllm_python="py"))


def test_an_engine_is_told_its_devices_only_on_a_host_with_devices() -> None:
    assert visible_devices([1, 3]) == {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert visible_devices([]) == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # no GPU
    assert visible_devices(None) == {}  # a pooled host: as before


def test_a_container_asks_docker_for_its_devices() -> None:
    from dgxmm.settings import RuntimeSettings

    runtime = DockerRuntime.__new__(DockerRuntime)
    runtime._settings = RuntimeSettings(kind="docker")
    runtime._in_container = lambda: True
    runtime._instance = "test"
    runtime._models_dir = None
    kind = ENGINES["vllm"]
    placed = Deployment(id="v", name="v", served_name="v", engine="vllm", model="m", memory_gib=40, placed_on=[1])
    config = runtime._config(placed, kind, "img")
    assert config["HostConfig"]["DeviceRequests"] == [{"Driver": "", "DeviceIDs": ["1"], "Capabilities": [["gpu"]]}]
    none = runtime._config(placed.model_copy(update={"placed_on": []}), kind, "img")
    assert "DeviceRequests" not in none["HostConfig"]
    pooled = runtime._config(placed.model_copy(update={"placed_on": None}), kind, "img")
    assert pooled["HostConfig"]["DeviceRequests"][0]["Count"] == -1  # a pooled host: all its GPUs, as before


def test_a_container_sees_a_hub_model_at_the_path_it_is_given() -> None:
    from dgxmm.deploy.runtimes.docker import binds

    store = Path("/srv/models")
    hub = Deployment(
        id="h", name="h", served_name="h", engine="vllm", model="hf://org/repo", memory_gib=4, volumes=["/a:/b"]
    )
    assert binds(hub, store) == ["/a:/b", "/srv/models:/srv/models:ro"]
    local = hub.model_copy(update={"model": "/b/model.gguf"})
    assert binds(local, store) == ["/a:/b"]  # a path of the user's: the user's volumes only
    mapped = hub.model_copy(update={"volumes": ["/disk/models:/srv:ro"]})
    assert binds(mapped, store) == ["/disk/models:/srv:ro"]  # the user's own mapping of the directory wins
    assert binds(hub, None) == ["/a:/b"]
