"""Models taking turns with real engines (issue 28), called through the model router by name:
memory for one of two models; with ``evict_idle_s = 0`` the second is served right after the
first was used (not after its 60 s idle timeout); with steady traffic to the first and a drain
after 3 s, the second is served and no request to the first is lost; a preloaded model starts
with dgxmm."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, engine_command, gateway_settings, wait_until

pytestmark = pytest.mark.timeout(120)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def two_models(serve: Any, tmp_path: Path, **ondemand: Any) -> tuple[Any, dict, dict]:
    svc = await serve(
        gateway_settings(
            tmp_path,
            memory={"capacity_gib": 4},
            ondemand={"idle_timeout_s": 60, "idle_timeout_min_s": 1, **ondemand},
            deployer={"metrics_interval_s": 0.2},
        )
    )
    views = [
        await svc.create(
            name=name, engine="command", memory_gib=4, mode="on_demand", command=engine_command("--chunk-delay", "0.05")
        )
        for name in ("chat", "coder")
    ]
    return svc, views[0], views[1]


def router(svc: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        timeout=60,
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
    )


@pytest.mark.bounded
async def test_with_evict_idle_0_the_second_model_is_served_right_after_the_first(serve, tmp_path: Path) -> None:
    svc, chat, coder = await two_models(serve, tmp_path, evict_idle_s=0)
    async with router(svc) as r:
        assert (await r.post("/chat/completions", json={**CHAT, "model": "chat"})).status_code == 200
        began = time.monotonic()
        second = await r.post("/chat/completions", json={**CHAT, "model": "coder"})
        waited = time.monotonic() - began
    assert second.status_code == 200
    assert waited < 30, f"{waited:.1f} s: it waited for chat's idle timeout (60 s)"  # a stop and a start
    assert (await svc.view(chat["id"]))["state"] == "stopped"
    events = (await svc.client.get(f"/api/events/history?deployment_id={chat['id']}")).json()
    assert any(e["text"] == "Stopped to make room for coder" for e in events)


async def test_a_busy_model_is_drained_for_the_other_and_none_of_its_requests_is_lost(serve, tmp_path: Path) -> None:
    # (evict_idle_s 2: the agent's gaps between requests, milliseconds with nothing in flight, are
    # no chance for make-room, as with evict 0 and a fresh idle sample: only the drain frees chat)
    svc, chat, coder = await two_models(serve, tmp_path, evict_idle_s=2, max_drain_wait_s=3)
    statuses: list[int] = []
    stop = asyncio.Event()

    async def agent(r: httpx.AsyncClient) -> None:  # steady traffic to chat, one request after another
        while not stop.is_set():
            statuses.append((await r.post("/chat/completions", json={**CHAT, "model": "chat"})).status_code)

    async with router(svc) as r:
        assert (await r.post("/chat/completions", json={**CHAT, "model": "chat"})).status_code == 200
        loop = asyncio.create_task(agent(r))
        await wait_until(lambda: len(statuses) >= 3, timeout=20)
        began = time.monotonic()
        second = await r.post("/chat/completions", json={**CHAT, "model": "coder"})
        waited = time.monotonic() - began
        served_before = len(statuses)
        await wait_until(lambda: len(statuses) > served_before + 1, timeout=60)  # chat is served again after
        stop.set()
        await loop
    assert second.status_code == 200 and waited < 30, waited
    assert statuses and set(statuses) == {200}, statuses
    events = (await svc.client.get(f"/api/events/history?deployment_id={chat['id']}")).json()
    assert any(e["text"].startswith("Drained and stopped to make room for coder") for e in events)


async def test_a_preloaded_model_starts_with_dgxmm_and_again_after_a_restart(serve, tmp_path: Path) -> None:
    settings = gateway_settings(tmp_path, memory={"capacity_gib": 4})
    svc = await serve(settings)
    warm = await svc.create(
        name="warm", engine="command", memory_gib=2, mode="on_demand", preload=True, command=engine_command()
    )
    cold = await svc.create(
        name="cold", engine="command", memory_gib=4, mode="on_demand", preload=True, command=engine_command()
    )
    assert warm["state"] == "starting" and cold["state"] == "stopped"  # 2 GiB left: cold waits for a request
    await svc.wait_state(warm["id"], "ready")
    await svc.shutdown()
    again = await serve(settings)
    await again.wait_state(warm["id"], "ready")
    assert (await again.view(cold["id"]))["state"] == "stopped"
    events = (await again.client.get(f"/api/events/history?deployment_id={cold['id']}")).json()
    assert any(e["text"].startswith("Not preloaded: it needs 4 GiB") for e in events)
