"""vLLM's sleep levels through dgxmm, with the test engine standing for vLLM's development-mode
routes (tests/engines/testengine_sleep.py; issue 52 item 2): each level's sleep and wake calls in
vLLM's order, an asleep deployment counted at what its level leaves held, and a wake that must
find its memory free plus ``wake_margin_gib``, making room first when it is not. What a real GPU
frees at each level is ``make gpu-check``'s to measure (docs/engines.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, Service, engine_command, gateway_settings, wait_until

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def router(svc: Service) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )


async def sleepy(svc: Service, name: str, gib: float, level: Any) -> dict[str, Any]:
    return await svc.create(
        name=name,
        engine="command",
        memory_gib=gib,
        mode="on_demand",
        sleep_mode=True,
        sleep_level=level,
        command=engine_command("--sleep-mode"),
    )


async def engine_calls(base_url: str) -> list[tuple[str, str, Any]]:
    async with httpx.AsyncClient() as c:
        seen = (await c.get(base_url + "/_test/requests")).json()
    return [(r["path"], r["query"], json.loads(r["body"]) if r["body"] else None) for r in seen]


async def held_gib(svc: Service) -> float:
    return float((await svc.client.get("/api/host")).json()["memory"]["held_gib"])


async def held_below(svc: Service, gib: float) -> bool:
    return await held_gib(svc) < gib


async def test_level_2_sleeps_holding_its_context_and_wakes_in_vllms_three_steps(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 10}))
    view = await sleepy(svc, "s", 4, 2)
    async with router(svc) as r:
        assert (await r.post("/chat/completions", json={**CHAT, "model": "s"})).status_code == 200
        ready = await svc.wait_state(view["id"], "ready")
        assert await held_gib(svc) == 4
        async with httpx.AsyncClient() as c:
            await c.delete(ready["base_url"] + "/_test/requests")
        assert (await svc.client.post(f"/api/deployments/{view['id']}/sleep")).json()["state"] == "asleep"
        # Counted at what it still holds: the estimate (its CUDA context, 1 GiB) until the sampler's
        # first reading taken asleep, then that reading (the test engine's own few MiB).
        assert await held_gib(svc) <= 1
        await wait_until(lambda: held_below(svc, 0.5))
        assert (await r.post("/chat/completions", json={**CHAT, "model": "s"})).status_code == 200
    calls = await engine_calls(ready["base_url"])
    assert calls[:4] == [
        ("/sleep", "level=2", None),
        ("/wake_up", "tags=weights", None),
        ("/collective_rpc", "", {"method": "reload_weights"}),
        ("/wake_up", "tags=kv_cache", None),
    ]
    assert calls[-1][0] == "/v1/chat/completions"  # after the wake's readiness probe
    events = (await svc.client.get("/api/events/history", params={"deployment_id": view["id"]})).json()
    assert "Put to sleep (level 2)" in [e["text"] for e in events]


async def test_the_kv_level_releases_and_takes_back_only_the_kv_cache(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await sleepy(svc, "k", 4, "kv")
    async with router(svc) as r:
        assert (await r.post("/chat/completions", json={**CHAT, "model": "k"})).status_code == 200
        ready = await svc.wait_state(view["id"], "ready")
        async with httpx.AsyncClient() as c:
            await c.delete(ready["base_url"] + "/_test/requests")
        await svc.client.post(f"/api/deployments/{view['id']}/sleep")
        assert (await r.post("/chat/completions", json={**CHAT, "model": "k"})).status_code == 200
    paths = [(path, query) for path, query, _ in await engine_calls(ready["base_url"])]
    assert paths[:2] == [("/sleep", "tags=kv_cache"), ("/wake_up", "tags=kv_cache")]


async def test_a_wake_without_its_memory_and_margin_free_makes_room_first(serve, tmp_path: Path) -> None:
    # 10 GiB: "s" (4 GiB, level 2) asleep holds 1; "b" (6 GiB) idle. The wake needs 4 + 1 (the
    # margin) free beside everything but "s" itself: 10 - 6 = 4 is short, so "b" is stopped first.
    settings = gateway_settings(tmp_path, memory={"capacity_gib": 10}, ondemand={"evict_idle_s": 0})
    svc = await serve(settings)
    s = await sleepy(svc, "s", 4, 2)
    b = await svc.create(name="b", engine="command", memory_gib=6, mode="on_demand", command=engine_command())
    async with router(svc) as r:
        assert (await r.post("/chat/completions", json={**CHAT, "model": "s"})).status_code == 200
        await svc.wait_state(s["id"], "ready")
        await svc.client.post(f"/api/deployments/{s['id']}/sleep")
        assert (await r.post("/chat/completions", json={**CHAT, "model": "b"})).status_code == 200
        await svc.wait_state(b["id"], "ready")
        assert await held_gib(svc) < 6 + 4  # "s" asleep counts less than its 4 GiB
        assert (await r.post("/chat/completions", json={**CHAT, "model": "s"})).status_code == 200
    assert (await svc.view(b["id"]))["state"] == "stopped"
    assert (await svc.view(s["id"]))["state"] == "ready"


async def test_a_sleep_level_is_checked_at_create(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    body = {"name": "x", "engine": "command", "memory_gib": 1, "command": engine_command("--sleep-mode")}
    for extra, field in (({"sleep_level": 2}, "sleep_mode"), ({"sleep_mode": True, "sleep_level": 3}, "sleep_level")):
        resp = await svc.client.post("/api/deployments", json={**body, **extra})
        assert resp.status_code == 422 and field in resp.text, resp.text


async def stream_text(chunks: AsyncIterator[str]) -> str:
    return "".join([chunk async for chunk in chunks])


async def test_a_sleep_waits_for_the_stream_in_flight_and_never_aborts_it(serve, tmp_path: Path) -> None:
    # The test engine aborts a stream it is put to sleep under, as vLLM's /sleep does: a stream
    # that ends with [DONE] was never slept under.
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="s",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        sleep_mode=True,
        command=engine_command("--sleep-mode", "--chunk-delay", "0.1"),
    )
    async with router(svc) as r:
        body = {**CHAT, "model": "s", "stream": True, "max_tokens": 10}
        async with r.stream("POST", "/chat/completions", json=body) as resp:
            chunks = resp.aiter_text()
            first = await anext(chunks)  # the engine is writing it now
            sleeping = asyncio.create_task(svc.client.post(f"/api/deployments/{view['id']}/sleep"))
            rest = await stream_text(chunks)
        assert (first + rest).rstrip().endswith("data: [DONE]")
        assert (await sleeping).json()["state"] == "asleep"
        # A request after it wakes it, and is answered.
        assert (await r.post("/chat/completions", json={**CHAT, "model": "s"})).status_code == 200


async def test_a_sleep_whose_requests_outlast_the_drain_is_refused_and_serves_on(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, ondemand={"sleep_drain_s": 0.3}))
    view = await svc.create(
        name="s",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        sleep_mode=True,
        command=engine_command("--sleep-mode", "--chunk-delay", "0.5"),
    )
    async with router(svc) as r:
        body = {**CHAT, "model": "s", "stream": True, "max_tokens": 6}
        async with r.stream("POST", "/chat/completions", json=body) as resp:
            chunks = resp.aiter_text()
            first = await anext(chunks)
            refused = await svc.client.post(f"/api/deployments/{view['id']}/sleep")
            assert refused.status_code == 409
            assert "1 request(s) still in flight after 0.3 s: not put to sleep" in refused.text
            rest = await stream_text(chunks)
        assert (first + rest).rstrip().endswith("data: [DONE]")
        assert (await svc.view(view["id"]))["state"] == "ready"
        assert (await r.post("/chat/completions", json={**CHAT, "model": "s"})).status_code == 200
