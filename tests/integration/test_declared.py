"""Deployments declared in files on the real service (issue 39's "done when"): created as
``managed_by: "config"``, read-only to the API but started and stopped through it, edits of the
files applied while it runs (the unchanged one keeps its id and its engine), a bad file shown in
``GET /api/host`` and changing nothing, and deployments made through the API left alone."""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path
from typing import Any

from conftest import Service, caller, engine_command, gateway_settings, make_settings, sse_events, wait_until

from dgxmm.declared.commands import check, export
from dgxmm.declared.parse import Sources, read
from dgxmm.declared.plan import declared_id


def table(name: str, gib: float = 2, mode: str = "on_demand") -> str:
    command = json.dumps(engine_command())
    return f'[[deployments]]\nname = "{name}"\nengine = "command"\ncommand = {command}\nmemory_gib = {gib}\nmode = "{mode}"\n'


async def views(svc: Service) -> dict[str, dict[str, Any]]:
    resp = await svc.client.get("/api/deployments")
    return {view["name"]: view for view in resp.json()}


async def test_declared_deployments_live_in_their_files(serve: Any, tmp_path: Path) -> None:
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    models = folder / "models.toml"
    models.write_text(table("one") + table("two") + table("three"))
    settings = make_settings(tmp_path, server={"deployments_dir": folder, "deployments_poll_s": 0.1})
    svc = await serve(settings)
    made = await svc.create(name="mine", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    mine = svc.ctx.deployer.get(made["id"])
    started_at = (await svc.client.get("/api/host")).json()["started_at"]

    found = await views(svc)
    assert {name: (v["managed_by"], v["declared_in"]) for name, v in found.items()} == {
        "one": ("config", str(models)),
        "two": ("config", str(models)),
        "three": ("config", str(models)),
        "mine": ("api", None),
    }
    one, two = found["one"]["id"], found["two"]["id"]
    for dep_id in (one, two):
        for method, path, body in [
            ("PATCH", f"/api/deployments/{dep_id}", {"memory_gib": 3}),
            ("PATCH", f"/api/deployments/{dep_id}/mode", {"mode": "always_on"}),
            ("DELETE", f"/api/deployments/{dep_id}", None),
        ]:
            resp = await svc.client.request(method, path, json=body)
            assert resp.status_code == 409, resp.text
            error = resp.json()["error"]
            assert error["code"] == "managed_by_config" and str(models) in error["message"]

    for dep_id in (one, two):
        assert (await svc.client.post(f"/api/deployments/{dep_id}/start")).status_code == 200
        await svc.wait_state(dep_id, "ready")
    assert (await svc.client.post(f"/api/deployments/{two}/stop")).status_code == 200
    assert (await svc.view(two))["state"] == "stopped"
    engine = svc.ctx.deployer.get(one).runtime_handle

    # One edit (an editor's save by rename): one kept, one removed, one given a new memory_gib,
    # one added; applied within a few seconds while dgxmm runs.
    (folder / "models.tmp").write_text(table("one") + table("three", gib=4) + table("four"))
    os.replace(folder / "models.tmp", models)

    def applied() -> bool:
        deps = {d.name: d for d in svc.ctx.deployer.all()}
        return sorted(deps) == ["four", "mine", "one", "three"] and deps["three"].memory_gib == 4

    await wait_until(applied, timeout=5)
    kept = await svc.view(one)
    assert kept["state"] == "ready" and svc.ctx.deployer.get(one).runtime_handle == engine
    assert (await svc.client.get("/api/host")).json()["started_at"] == started_at  # the same dgxmm

    # A file with an error changes nothing and says where; fixing it applies it.
    (folder / "models.toml").write_text(table("one", gib=5) + table("three").replace("memory_gib", "memory_gb"))

    async def error() -> Any:
        return (await svc.client.get("/api/host")).json()["config"]["error"]

    shown = await wait_until(error, timeout=10)
    assert (shown["file"], shown["table"], shown["name"], shown["field"]) == (
        str(folder / "models.toml"),
        2,
        "three",
        "memory_gb",
    )
    assert svc.ctx.deployer.get(one).memory_gib == 2 and applied()  # nothing of it applied
    plan = (await svc.client.get("/api/config/plan")).json()
    assert plan["valid"] is False and plan["error"]["field"] == "memory_gb"
    (folder / "models.toml").write_text(table("one", gib=5))
    await wait_until(lambda: svc.ctx.deployer.get(one).memory_gib == 5, timeout=10)
    assert await error() is None
    assert (await svc.view(one))["state"] == "stopped"  # restarted: on demand, at its next request
    assert svc.ctx.deployer.get(made["id"]) == mine  # untouched by every reload: the very same record
    plan = (await svc.client.get("/api/config/plan")).json()
    assert plan == {"valid": True, "error": None, "plan": plan["plan"]} and plan["plan"]["unchanged"] == 1


async def test_check_config_and_export_ask_a_running_dgxmm(serve: Any, tmp_path: Path) -> None:
    """A running dgxmm holds its database alone: check-config and export ask it instead."""
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    (folder / "models.toml").write_text(table("one"))
    settings = make_settings(tmp_path, server={"deployments_dir": folder, "deployments_poll_s": 30})
    svc = await serve(settings)
    await svc.create(name="mine", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    (folder / "models.toml").write_text(table("one", gib=3) + table("two"))
    out, err = io.StringIO(), io.StringIO()
    assert await asyncio.to_thread(check, settings, out, err) == 0, err.getvalue()
    assert out.getvalue().splitlines() == [
        "config ok",
        f"create  two ({folder / 'models.toml'})",
        "change  one: memory_gib",
        "unchanged: 0",
    ]
    (folder / "models.toml").write_text(table("mine"))
    err = io.StringIO()
    assert await asyncio.to_thread(check, settings, io.StringIO(), err) == 2
    assert "(mine) name: a deployment made through the API" in err.getvalue()
    out = io.StringIO()
    assert await asyncio.to_thread(export, settings, out) == 0
    exported = tmp_path / "exported.toml"
    exported.write_text(out.getvalue())
    assert [(d.name, d.fields["memory_gib"]) for d in read(Sources(exported, None))] == [("one", 2), ("mine", 1)]


async def test_a_busy_declared_engine_restarts_once_its_request_ended(serve: Any, tmp_path: Path) -> None:
    """An always-on engine serving a stream is not stopped for a change of its file: it restarts
    with the new settings once the stream has ended (the spec's "never stop a busy model")."""
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    slow = json.dumps(engine_command("--reply", "a b c d e f g h", "--chunk-delay", "0.3"))
    body = f'[[deployments]]\nname = "busy"\nengine = "command"\ncommand = {slow}\nmode = "always_on"\nmemory_gib = '
    (folder / "models.toml").write_text(body + "2\n")
    svc = await serve(gateway_settings(tmp_path, server={"deployments_dir": folder, "deployments_poll_s": 0.1}))
    dep_id = declared_id("busy")
    await svc.wait_state(dep_id, "ready")
    engine = svc.ctx.deployer.get(dep_id).runtime_handle
    request = {"model": "busy", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with caller(svc) as gateway, gateway.stream("POST", f"/{dep_id}/v1/chat/completions", json=request) as resp:
        assert resp.status_code == 200
        chunks = resp.aiter_lines()
        await anext(chunks)
        (folder / "models.toml").write_text(body + "3\n")
        await wait_until(lambda: svc.ctx.config_status is not None and svc.ctx.config_status()["pending"], timeout=10)
        dep = svc.ctx.deployer.get(dep_id)
        assert (dep.state.value, dep.memory_gib, dep.runtime_handle) == ("ready", 2, engine)
        rest = [line async for line in chunks]
    assert "data: [DONE]" in rest  # the stream ran to its end on the engine it began on
    await wait_until(lambda: svc.ctx.deployer.get(dep_id).memory_gib == 3, timeout=10)
    ready = await svc.wait_state(dep_id, "ready")
    assert ready["id"] == dep_id and svc.ctx.deployer.get(dep_id).runtime_handle != engine


async def test_ids_and_records_are_kept_across_a_restart_of_dgxmm(serve: Any, tmp_path: Path) -> None:
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    (folder / "models.toml").write_text(table("one") + table("two"))
    settings = make_settings(tmp_path, server={"deployments_dir": folder})
    svc = await serve(settings)
    before = {dep.name: dep for dep in svc.ctx.deployer.all()}
    await svc.shutdown()
    again = await serve(settings)
    after = {dep.name: dep for dep in again.ctx.deployer.all()}
    assert {name: (d.id, d.updated_at) for name, d in after.items()} == {
        name: (d.id, d.updated_at) for name, d in before.items()
    }  # the same deployments, not written again
    assert sorted(after) == ["one", "two"] and after["one"].id == declared_id("one")


async def test_a_declared_gguf_is_checked_as_the_api_checks_it_and_applied_once_it_is_there(
    serve: Any, tmp_path: Path
) -> None:
    """A missing llama.cpp model refuses the whole change (the other table too), named in
    GET /api/host, GET /api/config/plan and an ``event: config``; writing the file applies it,
    without touching the declaring file."""
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    gguf = tmp_path / "models" / "tiny.gguf"
    llama = (
        f'[[deployments]]\nname = "tiny"\nengine = "llamacpp"\nmode = "on_demand"\nmemory_gib = 1\nmodel = "{gguf}"\n'
    )
    (folder / "models.toml").write_text(table("one") + llama)
    svc = await serve(make_settings(tmp_path, server={"deployments_dir": folder, "deployments_poll_s": 0.1}))
    assert svc.ctx.deployer.all() == []  # nothing of the change, the valid table neither
    error = (await svc.client.get("/api/host")).json()["config"]["error"]
    assert {k: error[k] for k in ("file", "line", "table", "name", "field", "recheck")} == {
        "file": str(folder / "models.toml"),
        "line": 12,
        "table": 2,
        "name": "tiny",
        "field": "model",
        "recheck": True,
    }
    assert error["message"] == f"{gguf}: no such file on this host"
    plan = (await svc.client.get("/api/config/plan")).json()
    assert plan["valid"] is False and plan["error"]["field"] == "model"

    said: list[dict[str, Any]] = []

    async def listen() -> None:
        async with svc.client.stream("GET", "/api/events") as resp:
            async for event, data in sse_events(resp):
                if event == "config":
                    said.append(data)

    listener = asyncio.create_task(listen())
    try:
        gguf.parent.mkdir()
        gguf.write_bytes(b"GGUF")
        await wait_until(lambda: sorted(d.name for d in svc.ctx.deployer.all()) == ["one", "tiny"], timeout=10)
        assert (await svc.client.get("/api/host")).json()["config"]["error"] is None
        await wait_until(lambda: said and said[-1]["error"] is None, timeout=5)  # the console hears it go
        assert (await svc.view(declared_id("tiny")))["state"] == "stopped"  # on demand: its first request starts it
    finally:
        listener.cancel()
