"""Several GPUs read from NVML (issue 35), through a stand-in for nvidia-ml-py's ``pynvml`` that
answers its documented functions (``nvmlInit``, ``nvmlShutdown``, ``nvmlDeviceGetCount``,
``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetName``, ``nvmlDeviceGetUUID``,
``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetComputeRunningProcesses``,
``nvmlDeviceGetGraphicsRunningProcesses``, ``NVMLError``): placement from the readings, an
engine measured on another device than placed, a device that falls off the bus, a GB10."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Service, caller, engine_command, gateway_settings, wait_until
from integration.test_gateway_checks import CHAT

from dgxmm.deploy import budget as budget_module
from dgxmm.deploy.devicewatch import check_devices
from dgxmm.records.deployment import State

GIB = 1024**3
CREATE = {"engine": "command", "mode": "on_demand", "idle_timeout_s": 60}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None  # NVML's name


@dataclass
class Memory:
    total: int
    free: int
    used: int


@dataclass
class StandIn:
    """The devices NVML reports: their sizes (None: NOT_SUPPORTED, as a GB10), which of them
    are gone, and the processes using memory on each."""

    sizes: list[float | None]
    gone: set[int] = field(default_factory=set)
    procs: dict[int, list[Proc]] = field(default_factory=dict)
    NVML_ERROR_NOT_SUPPORTED: int = 3
    NVMLError: type[Exception] = NVMLError

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return len(self.sizes)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.gone:
            raise NVMLError(15)  # NVML_ERROR_GPU_IS_LOST
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA GB10" if self.sizes[handle] is None else "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle:08x}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:
        size = self.sizes[handle]
        if size is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return Memory(int(size * GIB), int((size - 1) * GIB), GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Proc]:
        return self.procs.get(handle, [])

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Proc]:
        return []


async def nvml_service(serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvml: StandIn) -> Service:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(budget_module, "_warned_unified", set())
    settings = gateway_settings(
        tmp_path, memory={"source": "nvml", "capacity_gib": None}, ondemand={"reaper_interval_s": 3600}
    )
    return await serve(settings)


async def engine_env(svc: Service, deployment_id: str) -> dict[str, Any]:
    dep = svc.ctx.deployer.get(deployment_id)
    assert dep.runtime_handle is not None
    async with httpx.AsyncClient() as client:
        return dict((await client.get(dep.runtime_handle.base_url + "/_test/env")).json())


async def chat(svc: Service, deployment_id: str) -> httpx.Response:
    async with caller(svc, timeout=60) as g:
        return await g.post(f"/{deployment_id}/v1/chat/completions", json=CHAT)


async def test_placement_from_nvml_readings_and_a_device_that_falls_off_the_bus(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = StandIn([80.0, 80.0])
    svc = await nvml_service(serve, tmp_path, monkeypatch, nvml)
    a = await svc.create(name="a", memory_gib=60, command=engine_command(), **CREATE)
    b = await svc.create(name="b", memory_gib=60, command=engine_command(), **CREATE)
    assert (await chat(svc, a["id"])).status_code == 200
    assert (await chat(svc, b["id"])).status_code == 200
    assert (await engine_env(svc, a["id"]))["CUDA_VISIBLE_DEVICES"] == "0"
    assert (await engine_env(svc, b["id"]))["CUDA_VISIBLE_DEVICES"] == "1"
    host = (await svc.client.get("/api/host")).json()
    assert [(d["index"], d["name"], d["total_gib"]) for d in host["devices"]] == [
        (0, "NVIDIA H100 80GB HBM3", 80),
        (1, "NVIDIA H100 80GB HBM3", 80),
    ]
    big = await svc.create(name="big", memory_gib=90, command=engine_command(), **CREATE)
    resp = await chat(svc, big["id"])
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "does_not_fit"

    nvml.gone.add(1)  # device 1 falls off the bus
    assert await check_devices(svc.ctx.deployer, set()) == [b["id"]]
    await wait_until(lambda: svc.ctx.deployer.get(b["id"]).state is State.FAILED)
    assert "device 1 (NVIDIA H100 80GB HBM3) is gone from NVML" in svc.ctx.deployer.get(b["id"]).state_reason
    assert (await chat(svc, a["id"])).status_code == 200  # the rest of the host keeps serving
    devices = (await svc.client.get("/api/host")).json()["devices"]
    assert devices[1]["free_gib"] == 0
    pinned = await svc.create(name="pinned", memory_gib=10, gpu_ids=[1], command=engine_command(), **CREATE)
    resp = await chat(svc, pinned["id"])  # nothing new is placed on a device that is gone
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "does_not_fit"


async def test_an_engine_measured_on_another_device_is_counted_there(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = StandIn([80.0, 80.0])
    svc = await nvml_service(serve, tmp_path, monkeypatch, nvml)
    own = await svc.create(
        name="own", memory_gib=60, command=engine_command(), env={"CUDA_VISIBLE_DEVICES": "1"}, **CREATE
    )
    assert (await chat(svc, own["id"])).status_code == 200
    seen = await engine_env(svc, own["id"])
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"  # its own env wins over where it was placed (device 0)
    nvml.procs[1] = [Proc(seen["pid"], 50 * GIB)]
    deployer = svc.ctx.deployer
    await wait_until(lambda: deployer.budget.devices_of(deployer.get(own["id"])) == (1,))
    accounts = deployer.snapshot().devices
    assert (accounts[0].held, accounts[1].held) == (0, 60)
    warnings = [r.getMessage() for r in caplog.records if "NVML shows its engine on device 1" in r.getMessage()]
    assert len(warnings) == 1, warnings


async def test_a_gb10_that_does_not_report_its_memory_is_one_device_sized_from_meminfo(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = await nvml_service(serve, tmp_path, monkeypatch, StandIn([None]))
    host = (await svc.client.get("/api/host")).json()
    [device] = host["devices"]
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024 / GIB
    assert device["name"] == "NVIDIA GB10" and abs(device["total_gib"] - total) < 0.01
    m = await svc.create(name="m", memory_gib=1, command=engine_command(), **CREATE)
    assert (await chat(svc, m["id"])).status_code == 200
