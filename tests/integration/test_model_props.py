"""llama-server's ``GET /props?model=NAME`` at the listener's root and the model list's ``meta``
(issue 50 items 1 and 3): a ready llama.cpp model's props are its engine's own answer; a model
that is not ready, or an engine kind without ``/props``, gets dgxmm's answer, which starts
nothing; the list tells each model's context where dgxmm knows it. The llama.cpp deployments
run the test engine in llama-server's place (``[engines] llamacpp_bin``), on a GGUF the test
writes. Real sockets, test engines as processes."""

from __future__ import annotations

import json

import sys
from pathlib import Path
from typing import Any

import httpx
from conftest import TEST_ENGINE, engine_command, gateway_settings
from dgxmm.demo.tiny_gguf import write_random_gguf
from test_model_management import code_of, root

TRAINED = 4096  # the GGUF's own context (the test engine's default --max-model-len is 2048)


def llama_server(tmp_path: Path) -> dict[str, Any]:
    """Settings whose llama-server is the test engine (it takes llama-server's flags)."""
    script = tmp_path / "llama-server"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{TEST_ENGINE}" "$@"\n')
    script.chmod(0o755)
    return {"llamacpp_bin": str(script)}


async def llamacpp(svc: Any, tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    gguf = tmp_path / "tiny.gguf"
    if not gguf.exists():
        write_random_gguf(gguf, n_ctx=TRAINED)
    body = {"name": name, "engine": "llamacpp", "model": str(gguf), "memory_gib": 1, "mode": "on_demand"}
    return await svc.create(**body, args=list(args))


async def engine_requests(svc: Any, dep: dict[str, Any]) -> list[str]:
    view = await svc.view(dep["id"])
    async with httpx.AsyncClient() as c:
        return [x["path"] for x in (await c.get(view["base_url"] + "/_test/requests")).json()]


async def test_props_of_a_ready_llama_cpp_model_are_its_engine_s_own(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, engines=llama_server(tmp_path)))
    dep = await llamacpp(svc, tmp_path, "tiny", "-c", "1024")
    async with root(svc) as r:
        stopped = await r.get("/props", params={"model": "tiny"})
        assert (await svc.view(dep["id"]))["state"] == "stopped"  # the answer started nothing
        assert [e["status"] for e in (await r.get("/models")).json()["data"]] == [{"value": "unloaded"}]
        assert (await r.post("/models/load", json={"model": "tiny"})).json() == {"success": True}
        ready = await r.get("/props", params={"model": "tiny"})
        view = await svc.view(dep["id"])
        async with httpx.AsyncClient() as c:
            own = (await c.get(view["base_url"] + "/props", params={"model": "tiny"})).json()
    assert stopped.status_code == 200, stopped.text
    assert stopped.json() == {
        "default_generation_settings": {"n_ctx": 1024},
        "model_alias": "tiny",
        "status": {"value": "unloaded"},
        "model_path": str(tmp_path / "tiny.gguf"),  # to the key file's key
    }
    assert ready.status_code == 200 and ready.json() == own  # unchanged
    assert own["build_info"] == "testengine" and own["default_generation_settings"]["n_ctx"] == 1024


async def test_props_never_start_or_wake_and_follow_the_caller_key_s_models(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, engines=llama_server(tmp_path)))
    mine = await llamacpp(svc, tmp_path, "mine")
    other = await llamacpp(svc, tmp_path, "other")
    command = await svc.create(
        name="cmd", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--max-model-len", "512")
    )
    made = await svc.client.post("/api/keys", json={"name": "one-model", "models": ["mine", "cmd"]})
    assert made.status_code == 201, made.text
    async with root(svc, made.json()["key"]) as r:
        props = await r.get("/props", params={"model": "mine"})
        theirs = await r.get("/props", params={"model": "other"})
        nameless = await r.get("/props")
        assert (await r.post("/models/load", json={"model": "cmd"})).json() == {"success": True}
        of_command = await r.get("/props", params={"model": "cmd"})  # ready, but no llama-server
    assert props.status_code == 200, props.text
    assert props.json() == {  # no path of the host to a caller key; the GGUF's own context
        "default_generation_settings": {"n_ctx": TRAINED},
        "model_alias": "mine",
        "status": {"value": "unloaded"},
    }
    assert (theirs.status_code, code_of(theirs)) == (404, "model_not_found")
    assert (nameless.status_code, code_of(nameless)) == (400, "invalid_request")
    assert of_command.json() == {"default_generation_settings": {}, "model_alias": "cmd", "status": {"value": "loaded"}}
    assert "/props" not in await engine_requests(svc, command)
    for dep in (mine, other):
        assert (await svc.view(dep["id"]))["state"] == "stopped"


async def test_the_model_list_tells_each_model_s_context_where_known(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, engines=llama_server(tmp_path)))
    await llamacpp(svc, tmp_path, "whole")
    await llamacpp(svc, tmp_path, "short", "--ctx-size=1024")
    await svc.create(name="vllm-like", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    folder = tmp_path / "hf-model"  # a model directory, as vLLM loads it: its config says its context
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "qwen2_vl", "text_config": {"max_position_embeddings": 32768}})
    )
    await svc.create(name="dir", engine="vllm", model=str(folder), memory_gib=1, mode="on_demand")
    await svc.create(
        name="dir-short",
        engine="vllm",
        model=str(folder),
        memory_gib=1,
        mode="on_demand",
        args=["--max-model-len", "8192"],
    )
    async with root(svc) as r:
        listed = {e["id"]: e.get("meta") for e in (await r.get("/models")).json()["data"]}
        under_v1 = {e["id"]: e.get("meta") for e in (await r.get("/v1/models")).json()["data"]}
    assert listed == under_v1
    assert listed == {
        "whole": {"n_ctx": TRAINED, "context_length": TRAINED, "n_ctx_train": TRAINED},
        "short": {"n_ctx": 1024, "context_length": 1024, "n_ctx_train": TRAINED},
        "vllm-like": None,  # nothing known: no meta
        "dir": {"n_ctx": 32768, "context_length": 32768, "n_ctx_train": 32768},
        "dir-short": {"n_ctx": 8192, "context_length": 8192, "n_ctx_train": 32768},
    }
