"""Admin API contract: auth, validation naming the field, 404/409, OpenAPI, SSE, audit, logs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import engine_command, make_settings, sse_events, wait_until


async def test_token_is_required(serve) -> None:
    svc = await serve()
    async with httpx.AsyncClient(base_url=svc.url) as anon:
        for path in ("/api/host", "/api/deployments", "/api/audit", "/api/events"):
            resp = await anon.get(path)
            assert resp.status_code == 401, path
            assert resp.json()["error"]["code"] == "unauthorized"
        resp = await anon.get("/api/host", headers={"Authorization": "Bearer wrong"})
        assert resp.status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"engine": "command", "command": ["x"], "memory_gib": 1}, "name"),
        ({"name": "bad name", "engine": "command", "command": ["x"], "memory_gib": 1}, "name"),
        ({"name": "a", "engine": "docker?", "command": ["x"], "memory_gib": 1}, "engine"),
        ({"name": "a", "engine": "command", "command": ["x"], "memory_gib": 0}, "memory_gib"),
        ({"name": "a", "engine": "command", "memory_gib": 1}, "command"),
        ({"name": "a", "engine": "llamacpp", "memory_gib": 1}, "model"),
        ({"name": "a", "engine": "command", "command": ["x"], "memory_gib": 1, "mode": "sometimes"}, "mode"),
        (
            {
                "name": "a",
                "engine": "command",
                "command": ["x"],
                "memory_gib": 1,
                "mode": "on_demand",
                "idle_timeout_s": 30,
            },
            "idle_timeout_s",
        ),
        (
            {
                "name": "a",
                "engine": "command",
                "command": ["x"],
                "memory_gib": 1,
                "mode": "on_demand",
                "role": "decider",
            },
            "mode",
        ),
        ({"name": "a", "engine": "command", "command": ["x"], "memory_gib": 1, "colour": "red"}, "colour"),
    ],
)
async def test_bad_input_is_422_naming_the_field(serve, body: dict[str, Any], field: str) -> None:
    svc = await serve()
    resp = await svc.client.post("/api/deployments", json=body)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["field"] == field and error["code"] == "invalid_input"
    assert error["message"].startswith(field)
    assert (await svc.client.get("/api/deployments")).json() == [], "nothing half-created"


async def test_unknown_id_is_404_and_conflicts_are_409(serve) -> None:
    svc = await serve()
    for method, path in (
        ("GET", "/api/deployments/nope"),
        ("DELETE", "/api/deployments/nope"),
        ("POST", "/api/deployments/nope/start"),
    ):
        resp = await svc.client.request(method, path)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    view = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    resp = await svc.client.post(f"/api/deployments/{view['id']}/start")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "conflict"
    resp = await svc.client.post(f"/api/deployments/{view['id']}/sleep")
    assert resp.status_code == 409 and "no sleep mode" in resp.json()["error"]["message"]
    dup = await svc.client.post(
        "/api/deployments", json={"name": "a", "engine": "command", "memory_gib": 1, "command": engine_command()}
    )
    assert dup.status_code == 409 and dup.json()["error"]["field"] == "name"


async def test_openapi_lists_the_admin_api(serve) -> None:
    svc = await serve()
    async with httpx.AsyncClient(base_url=svc.url) as anon:
        schema = (await anon.get("/api/openapi.json")).json()
    paths = set(schema["paths"])
    assert {
        "/dgxmm/api/host",
        "/dgxmm/api/deployments",
        "/dgxmm/api/deployments/{deployment_id}",
        "/dgxmm/api/events",
        "/dgxmm/api/audit",
    } <= paths


async def test_host_reports_memory(serve) -> None:
    svc = await serve()
    view = await svc.create(name="a", engine="command", memory_gib=30, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    host = (await svc.client.get("/api/host")).json()
    assert host["memory"]["usable_gib"] == 100 and host["memory"]["held_gib"] == 30
    assert host["memory"]["fixed_gib"] == 30 and host["memory"]["free_gib"] == 70
    assert host["ondemand"]["litellm_ready"] is False
    assert host["instance_id"] == svc.ctx.store.instance_id() and host["litellm"]["warm_first"] is False


async def test_host_shows_the_configured_instance_id(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path, server={"instance_id": "spark-02"}))
    assert (await svc.client.get("/api/host")).json()["instance_id"] == "spark-02"


async def _read_sse(resp: httpx.Response, out: list[tuple[str, dict[str, Any]]]) -> None:
    async for pair in sse_events(resp):
        out.append(pair)


async def test_event_stream_sends_views_and_event_rows(serve) -> None:
    svc = await serve()
    first = await svc.create(name="first", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    seen: list[tuple[str, dict[str, Any]]] = []
    async with svc.client.stream("GET", "/api/events") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        reader = asyncio.create_task(_read_sse(resp, seen))
        await wait_until(lambda: any(d.get("id") == first["id"] for _, d in seen))
        view = await svc.create(name="live", engine="command", memory_gib=1, command=engine_command())
        await wait_until(
            lambda: any(k == "deployment" and d.get("id") == view["id"] and d["state"] == "ready" for k, d in seen)
        )
        # The event row of the same moment is its own message on the stream: it may come after
        # the view (a loaded machine showed it), so the reader waits for it too.
        await wait_until(
            lambda: any(
                k == "log" and d["deployment_id"] == view["id"] and d["text"].startswith("Ready after") for k, d in seen
            )
        )
        reader.cancel()
    states = [d["state"] for k, d in seen if k == "deployment" and d.get("id") == view["id"]]
    assert states[:2] == ["stopped", "starting"] and states[-1] == "ready"
    logs = [d["text"] for k, d in seen if k == "log" and d["deployment_id"] == view["id"]]
    assert logs[0].startswith("Created live") and logs[-1].startswith("Ready after")


async def test_audit_and_logs(serve) -> None:
    svc = await serve()
    view = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    await svc.client.post(f"/api/deployments/{view['id']}/stop")
    rows = (await svc.client.get("/api/audit")).json()
    stop = next(r for r in rows if r["action"] == "stop")
    assert stop["user"] == "admin" and stop["old"] == {"state": "ready"} and stop["new"] == {"state": "stopped"}
    lines = (await svc.client.get(f"/api/deployments/{view['id']}/logs", params={"tail": 50})).json()["lines"]
    assert any("listening on 127.0.0.1" in line for line in lines)


async def test_sleep_and_wake(serve) -> None:
    svc = await serve()
    view = await svc.create(
        name="s", engine="command", memory_gib=1, sleep_mode=True, command=engine_command("--sleep-mode")
    )
    ready = await svc.wait_state(view["id"], "ready")
    resp = await svc.client.post(f"/api/deployments/{view['id']}/sleep")
    assert resp.json()["state"] == "asleep"
    async with httpx.AsyncClient() as c:
        assert (await c.get(ready["base_url"] + "/is_sleeping")).json() == {"is_sleeping": True}
        resp = await svc.client.post(f"/api/deployments/{view['id']}/wake")
        assert resp.json()["state"] == "starting"
        await svc.wait_state(view["id"], "ready")
        assert (await c.get(ready["base_url"] + "/is_sleeping")).json() == {"is_sleeping": False}


async def test_metrics_sampler_reads_running_requests(serve) -> None:
    svc = await serve()
    view = await svc.create(name="m", engine="command", memory_gib=1, command=engine_command("--chunk-delay", "0.2"))
    ready = await svc.wait_state(view["id"], "ready")
    sampler = svc.ctx.sampler
    await wait_until(lambda: sampler.latest(view["id"]) is not None)
    assert sampler.latest(view["id"]).idle
    async with httpx.AsyncClient(timeout=30) as c:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with c.stream("POST", ready["base_url"] + "/v1/chat/completions", json=body):
            sample = await wait_until(lambda: (s := sampler.latest(view["id"])) and s.running == 1 and s)
            assert sample.waiting == 0 and sample.age() < 5


async def test_unknown_placeholders_and_bad_json_are_422(serve) -> None:
    svc = await serve()
    resp = await svc.client.post(
        "/api/deployments", json={"name": "p", "engine": "command", "memory_gib": 1, "command": ["x", "{prot}"]}
    )
    assert resp.status_code == 422 and resp.json()["error"]["field"] == "command"
    assert "{port}" in resp.json()["error"]["message"]
    resp = await svc.client.post("/api/deployments", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 422 and resp.json()["error"].get("field") is None


async def test_host_tells_the_engine_kinds_and_the_idle_bounds_the_forms_check(serve, tmp_path) -> None:
    """The UI takes both from here (web/format.js learnHost): one place for each fact."""
    from dgxmm.deploy.engines import ENGINES

    svc = await serve(
        make_settings(tmp_path, ondemand={"idle_timeout_min_s": 20, "idle_timeout_max_s": 7200, "idle_timeout_s": 300})
    )
    host = (await svc.client.get("/api/host")).json()
    assert {k: host["ondemand"][k] for k in ("idle_timeout_s", "idle_timeout_min_s", "idle_timeout_max_s")} == {
        "idle_timeout_s": 300,
        "idle_timeout_min_s": 20,
        "idle_timeout_max_s": 7200,
    }
    kinds = {kind["name"]: kind for kind in host["engines"]}
    assert set(kinds) == set(ENGINES)
    assert kinds["llamacpp"]["label"] == "llama.cpp" and kinds["llamacpp"]["can_sleep"] is False
    assert kinds["command"]["needs"] == "command" and kinds["vllm"]["needs"] == "model"
    resp = await svc.client.post(
        "/api/deployments",
        json={"name": "x", "engine": "llamacpp", "model": "m.gguf", "memory_gib": 1, "sleep_mode": True},
    )
    assert resp.status_code == 422 and resp.json()["error"]["message"] == "sleep_mode: llama.cpp has no sleep mode"
