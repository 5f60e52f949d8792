"""A llama.cpp deployment's model is checked at create and edit (issue 41 item 8): a path that
does not exist, cannot be read or is no GGUF is a 422 naming ``model``; an ``hf://`` model is
not read (it is asked of the hub, which does not answer here: the edit goes on); an edit of a
failed deployment leaves it stopped, its old failure gone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import engine_command, make_settings

from dgxmm.api import modelcheck


async def refusal(resp) -> str:
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["field"] == "model"
    return str(error["message"])


async def test_create_and_edit_refuse_what_llama_server_cannot_load(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path, engines={"llamacpp_bin": "/opt/llama-server"}))
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(b"GGUF")
    locked.chmod(0)
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    cases = {
        str(tmp_path / "none.gguf"): "no such file",
        str(text): "not a GGUF file",
        str(tmp_path): "a directory",
        str(fifo): "not a regular file",
    }
    if os.geteuid() != 0:  # root reads any file
        cases[str(locked)] = "permission denied"
    body = {"name": "lc", "engine": "llamacpp", "memory_gib": 1, "mode": "on_demand"}
    for model, why in cases.items():
        message = await refusal(await svc.client.post("/api/deployments", json=body | {"model": model}))
        assert message.startswith(f"model: {model}: ") and why in message, message
    assert (await svc.client.get("/api/deployments")).json() == []

    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF\x03\x00\x00\x00")
    created = await svc.create(**body, model=str(good))
    path = f"/api/deployments/{created['id']}"
    message = await refusal(await svc.client.patch(path, json={"model": str(text)}))
    assert "not a GGUF file" in message
    assert (await svc.view(created["id"]))["model"] == str(good)
    # A store model that is not downloaded yet is not read (the hub that cannot be asked lets it pass).
    resp = await svc.client.patch(path, json={"model": "hf://org/repo/m.gguf"})
    assert resp.status_code == 200 and resp.json()["model"] == "hf://org/repo/m.gguf"
    # Other engines name models the check cannot see (a Hugging Face name, for vLLM).
    vllm = await svc.create(name="v", engine="vllm", model="org/name", memory_gib=1, mode="on_demand")
    assert vllm["model"] == "org/name"


async def test_a_file_that_does_not_answer_is_refused_within_the_bound(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = await serve(make_settings(tmp_path))
    monkeypatch.setattr(modelcheck, "DEADLINE_S", 0.2)
    import threading

    release = threading.Event()
    monkeypatch.setattr(modelcheck, "why_not_gguf", lambda path: release.wait(5) and None)
    body = {"name": "lc", "engine": "llamacpp", "model": "/hung/m.gguf", "memory_gib": 1, "mode": "on_demand"}
    try:
        message = await refusal(await svc.client.post("/api/deployments", json=body))
        assert "did not answer within 0.2 s" in message
    finally:
        release.set()


async def test_an_edit_of_a_failed_deployment_leaves_it_stopped_without_the_old_failure(serve, tmp_path) -> None:
    svc = await serve(make_settings(tmp_path))
    dep = await svc.create(
        name="f", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--fail-start")
    )
    path = f"/api/deployments/{dep['id']}"
    await svc.client.post(f"{path}/start")
    failed = await svc.wait_state(dep["id"], "failed")
    assert failed["state_reason"]
    resp = await svc.client.patch(path, json={"command": engine_command()})
    assert resp.status_code == 200, resp.text
    view = resp.json()
    assert view["state"] == "stopped" and view["state_reason"] == "Settings changed since the failed start"
    await svc.client.post(f"{path}/start")
    assert (await svc.wait_state(dep["id"], "ready"))["state"] == "ready"
