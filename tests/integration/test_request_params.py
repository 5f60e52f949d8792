"""What issue 51 carries over from llama-swap and Ollama, through the real service and test
engines: a deployment's request parameters reach the engine whatever the client sent (items 4),
and ``idle_timeout_s = 0`` is never reaped yet gives way to make-room (item 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from conftest import caller, engine_command, gateway_settings, wait_until
from integration.test_router import engine_bodies, router

from dgxmm.records.deployment import State

MESSAGES = [{"role": "user", "content": "hi"}]
PARAMS = {
    "request_overrides": {"temperature": 0.2},
    "request_defaults": {"top_k": 40},
    "strip_params": ["seed"],
}


async def clear(view: dict[str, Any]) -> None:
    async with httpx.AsyncClient() as c:
        await c.delete(view["base_url"] + "/_test/requests")


async def test_request_overrides_reach_the_engine_whatever_the_client_sent(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="pinned",
        aliases=["p"],
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=engine_command(),
        **PARAMS,
    )
    assert {key: view[key] for key in PARAMS} == PARAMS  # the view shows them (the console's detail)
    sent: list[bytes] = [
        json.dumps({"model": "p", "messages": MESSAGES, "temperature": 1.5, "seed": 7}).encode(),
        json.dumps({"model": "pinned", "messages": MESSAGES}).encode(),
        b'{"temperature": 0, "model": "p", "seed": 1, "messages": [], "temperature": "hot", "top_k": 3}',
        b'{"model":"p","prompt":"\\u00e9 1e400","temperature":null}',
    ]
    paths = ["/chat/completions", "/chat/completions", "/chat/completions", "/completions"]
    async with router(svc, **{"Content-Type": "application/json"}) as r:
        for path, body in zip(paths, sent, strict=True):
            resp = await r.post(path, content=body)
            assert resp.status_code == 200, resp.text
        responses = await r.post("/responses", json={"model": "p", "input": "hi", "temperature": 2})
        embedded = await r.post("/embeddings", json={"model": "p", "input": "hi", "temperature": 2, "seed": 1})
    assert responses.status_code == 200 and embedded.status_code == 200, (responses.text, embedded.text)
    async with caller(svc) as g:  # the per-deployment gateway applies them too
        direct = await g.post(f"/{view['id']}/v1/chat/completions", json={"model": "pinned", "temperature": 9})
    assert direct.status_code == 200, direct.text
    ready = await svc.view(view["id"])
    bodies = await engine_bodies(ready)
    got = [json.loads(body) for body in bodies]
    assert [b["temperature"] for b in got] == [0.2, 0.2, 0.2, 0.2, 0.2, 2, 0.2]
    assert [b.get("top_k") for b in got] == [40, 40, 3, 40, 40, None, 40]
    assert all("seed" not in b for b in got[:5]) and got[5]["seed"] == 1  # embeddings: as sent
    assert got[0]["model"] == "pinned" and got[0]["messages"] == MESSAGES
    assert '"prompt":"\\u00e9 1e400"' in bodies[3]  # the rest byte for byte

    # Changed while the engine runs: the next request gets the new ones.
    changed = await svc.client.patch(
        f"/api/deployments/{view['id']}", json={"request_overrides": {"temperature": 0.7}, "strip_params": []}
    )
    assert changed.status_code == 200 and changed.json()["state"] == "ready", changed.text
    await clear(ready)
    async with router(svc) as r:
        assert (await r.post("/chat/completions", json={"model": "p", "temperature": 1, "seed": 3})).status_code == 200
    [after] = [json.loads(body) for body in await engine_bodies(ready)]
    assert after == {"model": "pinned", "temperature": 0.7, "seed": 3, "top_k": 40}


async def test_a_bad_parameter_is_refused_by_the_api(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    base = {"name": "m", "engine": "command", "memory_gib": 1, "command": engine_command()}
    for bad in (
        {"request_overrides": {"model": "x"}},
        {"strip_params": ["stream"]},
        {"request_defaults": {"top_k": 1}, "request_overrides": {"top_k": 2}},
        {"request_defaults": {"stop": [None]}},
    ):
        resp = await svc.client.post("/api/deployments", json={**base, **bad})
        assert resp.status_code == 422, (bad, resp.text)


async def test_idle_timeout_0_is_never_reaped_and_is_stopped_by_make_room(serve, tmp_path: Path) -> None:
    """``kept`` (idle_timeout_s = 0) stays ready through reaper passes that stop ``other`` (1 s
    idle) after it had been idle longer; a start of ``x`` that needs its memory stops it."""
    settings = gateway_settings(
        tmp_path,
        memory={"capacity_gib": 10},
        ondemand={"reaper_interval_s": 0.2, "idle_timeout_min_s": 0.5},
    )
    svc = await serve(settings)
    create = {"engine": "command", "mode": "on_demand", "command": engine_command()}
    kept = await svc.create(name="kept", memory_gib=6, idle_timeout_s=0, **create)
    other = await svc.create(name="other", memory_gib=1, idle_timeout_s=1, **create)
    x = await svc.create(name="x", memory_gib=8, idle_timeout_s=60, **create)
    controller, deployer = svc.ctx.ondemand, svc.ctx.deployer
    await svc.client.post(f"/api/deployments/{kept['id']}/start")
    await svc.wait_state(kept["id"], "ready")
    await wait_until(lambda: controller.is_evictable(deployer.get(kept["id"])))  # idle to make-room
    await svc.client.post(f"/api/deployments/{other['id']}/start")
    await svc.wait_state(other["id"], "ready")
    await svc.wait_state(other["id"], "stopped", timeout=30)  # the reaper ran, kept idle all along
    assert deployer.get(kept["id"]).state is State.READY
    assert (await svc.view(kept["id"]))["idle_timeout_s"] == 0
    async with router(svc) as r:
        resp = await r.post("/chat/completions", json={"model": "x", "messages": MESSAGES}, timeout=60)
    assert resp.status_code == 200, resp.text
    assert deployer.get(kept["id"]).state is State.STOPPED and deployer.get(x["id"]).state is State.READY
    assert (await svc.view(kept["id"]))["state_reason"] == "Stopped to make room for x"
