"""llama.cpp's API at the listener's root (issue 50 items 1, 2 and 5), as Open WebUI's llama.cpp
connection, ``pi``, Letta Code and editors' completion use it: ``GET /models`` with each model's
load state, ``POST /models/load`` and ``/models/unload`` (each audited with the key's name),
llama-swap's ``GET /running`` and ``POST /api/models/unload[/{model}]``, and llama-server's own
``/infill``, ``/completion`` and ``/reranking``; every check ``/v1`` makes, a caller key's models
included. Real sockets, test engines as processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import json

import httpx
from conftest import KEY, engine_command, gateway_settings


def root(svc: Any, key: str = KEY) -> httpx.AsyncClient:
    """A caller of the listener's root from an allowed peer."""
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


async def on_demand(svc: Any, name: str, *flags: str) -> dict[str, Any]:
    return dict(
        await svc.create(name=name, engine="command", memory_gib=1, mode="on_demand", command=engine_command(*flags))
    )


def code_of(resp: httpx.Response) -> str:
    return str(resp.json()["error"]["code"])


async def audit(svc: Any, deployment_id: str) -> list[dict[str, Any]]:
    resp = await svc.client.get("/api/audit", params={"deployment_id": deployment_id})
    assert resp.status_code == 200, resp.text
    return list(resp.json())


async def test_list_load_and_unload_as_llama_cpp_s_router_answers_them(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    chat = await on_demand(svc, "chat")
    async with root(svc) as r:
        listed = await r.get("/models")
        assert listed.status_code == 200
        assert [(e["id"], e["status"]) for e in listed.json()["data"]] == [("chat", {"value": "unloaded"})]
        assert (await r.get("/running")).json() == {"running": []}
        assert (await svc.view(chat["id"]))["state"] == "stopped"  # the list started nothing

        loaded = await r.post("/models/load", json={"model": "chat"})
        assert (loaded.status_code, loaded.json()) == (200, {"success": True})
        assert (await svc.view(chat["id"]))["state"] == "ready"  # answered once ready
        assert [e["status"] for e in (await r.get("/models")).json()["data"]] == [{"value": "loaded"}]
        assert (await r.get("/running")).json() == {"running": [{"model": "chat", "state": "ready", "name": "chat"}]}

        unloaded = await r.post("/models/unload", json={"model": "chat"})
        assert (unloaded.status_code, unloaded.json()) == (200, {"success": True})
        await svc.wait_state(chat["id"], "stopped")


async def test_unload_refuses_a_busy_model_and_load_and_unload_refuse_bad_input(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    busy = await on_demand(svc, "busy", "--chunk-delay", "0.5")
    body = {"model": "busy", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with root(svc) as r, r.stream("POST", "/v1/chat/completions", json=body) as stream:
        assert stream.status_code == 200
        lines = stream.aiter_lines()
        await anext(lines)  # in flight now
        refused = await r.post("/models/unload", json={"model": "busy"})
        assert refused.status_code == 409 and code_of(refused) == "busy", refused.text
        not_json = await r.post("/models/load", content=b"{oops", headers={"content-type": "application/json"})
        nameless = await r.post("/models/load", json={"name": "busy"})
        unknown = await r.post("/models/load", json={"model": "nope"})
        wrong_method = await r.get("/models/load")
        async for _ in lines:
            pass
    assert (not_json.status_code, code_of(not_json)) == (400, "invalid_request")
    assert (nameless.status_code, code_of(nameless)) == (400, "invalid_request")
    assert (unknown.status_code, code_of(unknown)) == (404, "model_not_found")
    assert wrong_method.status_code == 405
    assert (await svc.view(busy["id"]))["state"] == "ready"  # never stopped under its stream


async def test_unload_of_an_always_on_model_is_409_and_stops_nothing(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    fixed = await svc.create(name="fixed", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(fixed["id"], "ready")
    async with root(svc) as r:
        refused = await r.post("/models/unload", json={"model": "fixed"})
    assert (refused.status_code, code_of(refused)) == (409, "not_on_demand"), refused.text
    assert "the admin API stops it" in refused.json()["error"]["message"]
    assert (await svc.view(fixed["id"]))["state"] == "ready"


async def test_a_caller_key_loads_and_unloads_its_own_models_only(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    mine, other = await on_demand(svc, "mine"), await on_demand(svc, "other")
    made = await svc.client.post("/api/keys", json={"name": "one-model", "models": ["mine"]})
    assert made.status_code == 201, made.text
    async with root(svc, made.json()["key"]) as r:
        listed = [e["id"] for e in (await r.get("/models")).json()["data"]]
        theirs = await r.post("/models/load", json={"model": "other"})
        loaded = await r.post("/models/load", json={"model": "mine"})
        not_theirs = await r.post("/models/unload", json={"model": "other"})
        unloaded = await r.post("/models/unload", json={"model": "mine"})
    assert listed == ["mine"]
    assert (theirs.status_code, code_of(theirs)) == (404, "model_not_found")
    assert (not_theirs.status_code, code_of(not_theirs)) == (404, "model_not_found")
    assert loaded.json() == {"success": True} and unloaded.json() == {"success": True}
    await svc.wait_state(mine["id"], "stopped")
    assert (await svc.view(other["id"]))["state"] == "stopped"
    rows = [(r["action"], r["actor"], r["user"]) for r in await audit(svc, mine["id"]) if r["actor"] == "gateway"]
    assert rows == [("unload", "gateway", "one-model"), ("load", "gateway", "one-model")]  # newest first
    assert not [r for r in await audit(svc, other["id"]) if r["actor"] == "gateway"]  # refused: nothing done
    async with root(svc, "sk-wrong") as r:
        assert (await r.post("/models/load", json={"model": "mine"})).status_code == 401


async def test_llama_server_s_own_routes_reach_the_engine_under_its_paths_through_a_cold_start(
    serve, tmp_path: Path
) -> None:
    svc = await serve(gateway_settings(tmp_path))
    dep = await on_demand(svc, "coder")
    infill = {"model": "coder", "input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 8}
    async with root(svc) as r:
        raw = json.dumps(infill, indent=1).encode()  # spacing no re-encoding would keep
        filled = await r.post("/infill", content=raw, headers={"content-type": "application/json"})  # a cold start
        async with r.stream("POST", "/completion", json={"model": "coder", "prompt": "1 2", "stream": True}) as s:
            assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[6:]) for line in [x async for x in s.aiter_lines()] if line.startswith("data: ")]
        ranked = await r.post("/reranking", json={"model": "coder", "query": "q", "documents": ["a"]})
        under_v1 = await r.post("/v1/infill", json=infill)  # llama-server has no /v1/infill
    assert (filled.status_code, filled.json()["path"]) == (200, "/infill")
    assert [e["content"] for e in events] == ["one", " two", " three"]
    assert ranked.status_code == 200 and ranked.json()["path"] == "/v1/reranking"
    assert (under_v1.status_code, code_of(under_v1)) == (404, "not_found")
    view = await svc.view(dep["id"])
    async with httpx.AsyncClient() as c:
        sent = [x for x in (await c.get(view["base_url"] + "/_test/requests")).json() if x["method"] == "POST"]
    assert [(x["path"], x["body"]) for x in sent[:1]] == [("/infill", raw.decode())]  # byte for byte
    assert [x["path"] for x in sent] == ["/infill", "/completion", "/v1/reranking"]


async def test_llama_swap_s_unload_stops_idle_models_and_keeps_busy_ones(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    idle = await on_demand(svc, "idle")
    command = engine_command("--chunk-delay", "0.5")
    busy = await svc.create(
        name="busy", served_name="org/busy", engine="command", memory_gib=1, mode="on_demand", command=command
    )
    stopped = await on_demand(svc, "stopped")
    body = {"model": "org/busy", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with root(svc) as r:
        assert (await r.post("/models/load", json={"model": "idle"})).json() == {"success": True}
        async with r.stream("POST", "/v1/chat/completions", json=body) as stream:
            lines = stream.aiter_lines()
            await anext(lines)  # in flight now
            every = await r.post("/api/models/unload")
            one_busy = await r.post("/api/models/unload/org/busy")
            async for _ in lines:
                pass
        one = await r.post("/api/models/unload/org/busy")  # the path's rest names it, slashes and all
        unknown = await r.post("/api/models/unload/nope")
        wrong_method = await r.get("/api/models/unload")
        tags = await r.get("/api/tags")  # Ollama's /api, untouched
    assert every.status_code == 200, every.text
    assert every.json()["msg"] == "ok" and every.json()["unloaded"] == ["idle"]
    assert [(k["model"], k["error"]["code"]) for k in every.json()["kept"]] == [("org/busy", "busy")]
    assert (one_busy.status_code, code_of(one_busy)) == (409, "busy")
    assert (one.status_code, one.text, one.headers["content-type"]) == (200, "OK", "text/plain; charset=utf-8")
    assert (unknown.status_code, code_of(unknown)) == (404, "model_not_found")
    assert wrong_method.status_code == 405
    assert tags.status_code == 200 and len(tags.json()["models"]) == 3
    await svc.wait_state(idle["id"], "stopped")
    await svc.wait_state(busy["id"], "stopped")
    assert (await svc.view(stopped["id"]))["state"] == "stopped"
    assert [(r["action"], r["user"]) for r in await audit(svc, busy["id"]) if r["actor"] == "gateway"] == [
        ("unload", "key-file")
    ]
