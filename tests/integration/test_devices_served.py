"""Several GPUs through the real service (issue 35): declared devices ``[80, 80]``, real test
engines that report the device variables they were started with, the gateway's real sockets.

What this proves: the budget keeps one account per device, placement and make-room work per
device, and each engine is told its devices. What it cannot: that CUDA honours what it is told
(no GPU here; docs/engines.md#several-gpus)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, Service, caller, engine_command, gateway_settings, wait_until
from integration.test_gateway_checks import CHAT

from dgxmm.records.deployment import State

CREATE = {"engine": "command", "mode": "on_demand", "idle_timeout_s": 60, "command": engine_command()}


async def devices_service(serve, tmp_path: Path) -> Service:
    settings = gateway_settings(
        tmp_path,
        memory={"capacity_gib": None, "devices_gib": [80, 80]},
        ondemand={"evict_idle_s": 0, "reaper_interval_s": 3600},
    )
    return await serve(settings)


async def seen_devices(svc: Service, deployment_id: str) -> dict[str, Any]:
    """The device variables the deployment's engine was started with."""
    dep = svc.ctx.deployer.get(deployment_id)
    assert dep.runtime_handle is not None
    async with httpx.AsyncClient() as client:
        resp = await client.get(dep.runtime_handle.base_url + "/_test/env")
    found = dict(resp.json())
    found.pop("pid")
    return found


async def chat(svc: Service, deployment_id: str) -> httpx.Response:
    async with caller(svc, timeout=60) as g:
        return await g.post(f"/{deployment_id}/v1/chat/completions", json=CHAT)


async def idle(svc: Service, *ids: str) -> None:
    controller, deployer = svc.ctx.ondemand, svc.ctx.deployer
    await wait_until(lambda: all(controller.is_evictable(deployer.get(i)) for i in ids))


async def test_models_are_placed_per_device_and_make_room_stops_only_what_is_in_the_way(serve, tmp_path: Path) -> None:
    svc = await devices_service(serve, tmp_path)
    a = await svc.create(name="a", memory_gib=60, **CREATE)
    b = await svc.create(name="b", memory_gib=60, **CREATE)
    c = await svc.create(name="c", memory_gib=60, **CREATE)

    # Two 60 GiB models run at once, one per device, each engine seeing only its device.
    assert (await chat(svc, a["id"])).status_code == 200
    assert (await chat(svc, b["id"])).status_code == 200
    assert await seen_devices(svc, a["id"]) == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert (await seen_devices(svc, b["id"]))["CUDA_VISIBLE_DEVICES"] == "1"
    views = {v["id"]: v for v in (await svc.client.get("/api/deployments")).json()}
    assert (views[a["id"]]["gpu_ids"], views[b["id"]]["gpu_ids"], views[c["id"]]["gpu_ids"]) == ([0], [1], None)
    host = (await svc.client.get("/api/host")).json()
    assert [(d["index"], d["total_gib"], d["held_gib"], d["free_gib"], d["usable_gib"]) for d in host["devices"]] == [
        (0, 80, 60, 20, 80),
        (1, 80, 60, 20, 80),
    ]
    points = (await svc.client.get("/api/host/history")).json()["points"]
    assert points[-1]["placed"] == {a["id"]: [0], b["id"]: [1]}

    # A third makes room by stopping only the least recently used idle one, and takes its device.
    await idle(svc, a["id"], b["id"])
    assert (await chat(svc, c["id"])).status_code == 200
    deployer = svc.ctx.deployer
    assert deployer.get(a["id"]).state is State.STOPPED
    assert deployer.get(b["id"]).state is State.READY
    assert (await seen_devices(svc, c["id"]))["CUDA_VISIBLE_DEVICES"] == "0"

    # A 120 GiB model with gpus = 2 spans both: both idle models make room.
    wide = await svc.create(name="wide", memory_gib=120, gpus=2, **CREATE)
    await idle(svc, b["id"], c["id"])
    assert (await chat(svc, wide["id"])).status_code == 200
    assert (await seen_devices(svc, wide["id"]))["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert {deployer.get(i).state for i in (b["id"], c["id"])} == {State.STOPPED}

    page = (await svc.client.get("/metrics")).text
    assert 'dgxmm_device_memory_bytes{device="1",kind="held"} 6.442450944e+10' in page


async def test_too_big_for_any_device_is_refused_at_once_and_a_pin_is_kept(serve, tmp_path: Path) -> None:
    svc = await devices_service(serve, tmp_path)
    big = await svc.create(name="big", memory_gib=90, **CREATE)  # 160 GiB in all, 80 on a device
    resp = await chat(svc, big["id"])
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "does_not_fit"
    assert "on any device it may use" in resp.json()["error"]["message"]
    assert svc.ctx.deployer.get(big["id"]).state is State.STOPPED

    pinned = await svc.create(name="pinned", memory_gib=10, gpu_ids=[1], **CREATE)
    assert (await chat(svc, pinned["id"])).status_code == 200
    assert (await seen_devices(svc, pinned["id"]))["CUDA_VISIBLE_DEVICES"] == "1"
    view = (await svc.client.get(f"/api/deployments/{pinned['id']}")).json()
    assert (view["gpu_ids"], view["gpu_pins"]) == ([1], [1])


async def test_bad_device_fields_are_refused_naming_the_field(serve, tmp_path: Path) -> None:
    svc = await devices_service(serve, tmp_path)
    bad = [
        ({"gpu_ids": [2]}, "gpu_ids"),  # no such device
        ({"gpu_ids": [0, 0], "gpus": 2}, "gpu_ids"),  # twice the same
        ({"gpus": 3}, "gpus"),  # more than the host has
        ({"gpus": 2, "gpu_ids": [0]}, "gpu_ids"),  # as many pins as it spans
    ]
    for i, (fields, field) in enumerate(bad):
        resp = await svc.client.post("/api/deployments", json={"name": f"x{i}", "memory_gib": 10, **CREATE, **fields})
        assert resp.status_code == 422, resp.text
        assert field in resp.text, resp.text
    vllm = {
        "name": "v",
        "engine": "vllm",
        "model": "/models/m",
        "memory_gib": 40,
        "mode": "on_demand",
        "args": ["-tp", "2"],
        "gpus": 1,
    }
    resp = await svc.client.post("/api/deployments", json=vllm)
    assert resp.status_code == 422 and "gpus" in resp.text
    assert (await svc.client.get("/api/deployments")).json() == []  # nothing half-created
    del vllm["gpus"]
    created = (await svc.client.post("/api/deployments", json=vllm)).json()
    assert created["gpus"] == 2  # set by the engine's own parallel flags
    assert KEY not in str(created)
