"""Deployments through the real API with test-engine processes: start, ready, stop, failures."""

from __future__ import annotations

import pytest

import contextlib
import os
import signal
from pathlib import Path

import httpx
from conftest import engine_command, make_settings, wait_until


async def test_create_start_ready_stop(serve, tmp_path: Path) -> None:
    svc = await serve()
    view = await svc.create(name="m1", engine="command", memory_gib=4, command=engine_command("--start-delay", "0.3"))
    assert view["state"] == "starting" and view["mode"] == "always_on"
    ready = await svc.wait_state(view["id"], "ready")
    assert ready["base_url"].startswith("http://127.0.0.1:")
    async with httpx.AsyncClient() as c:
        models = (await c.get(ready["base_url"] + "/v1/models")).json()
    assert models["data"][0]["id"] == "m1"

    resp = await svc.client.post(f"/api/deployments/{view['id']}/stop")
    assert resp.status_code == 200 and resp.json()["state"] == "stopped"
    async with httpx.AsyncClient() as c:
        try:
            await c.get(ready["base_url"] + "/health", timeout=2)
            raise AssertionError("the engine still answers after stop")
        except httpx.ConnectError:
            pass
    events = (await svc.client.get("/api/events/history", params={"deployment_id": view["id"]})).json()
    texts = [e["text"] for e in events]
    assert any(t.startswith("Ready after") for t in texts) and "Stopped" in texts


async def test_on_demand_deployment_is_created_stopped(serve) -> None:
    svc = await serve()
    view = await svc.create(name="od", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    assert view["state"] == "stopped" and view["mode"] == "on_demand"
    resp = await svc.client.post(f"/api/deployments/{view['id']}/start")
    assert resp.json()["state"] == "starting"
    await svc.wait_state(view["id"], "ready")


async def test_failed_start_keeps_reason_and_log_tail(serve) -> None:
    svc = await serve()
    view = await svc.create(name="bad", engine="command", memory_gib=1, command=engine_command("--fail-start"))
    failed = await svc.wait_state(view["id"], "failed")
    assert "engine exited during start-up (exit code 1)" in failed["state_reason"]
    assert "simulated start failure" in failed["state_reason"]
    assert failed["base_url"] is None


async def test_missing_program_fails_the_start(serve) -> None:
    svc = await serve()
    view = await svc.create(name="nope", engine="command", memory_gib=1, command=["/nonexistent/engine", "{port}"])
    failed = await svc.wait_state(view["id"], "failed")
    assert "cannot run /nonexistent/engine" in failed["state_reason"]


async def test_start_timeout_fails(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path, deployer={"start_timeout_s": 1}))
    view = await svc.create(name="slow", engine="command", memory_gib=1, command=engine_command("--never-healthy"))
    failed = await svc.wait_state(view["id"], "failed")
    assert failed["state_reason"].startswith("not ready after 1 s")


async def test_watchdog_catches_a_crash(serve) -> None:
    svc = await serve()
    view = await svc.create(name="crashy", engine="command", memory_gib=1, command=engine_command())
    ready = await svc.wait_state(view["id"], "ready")
    async with httpx.AsyncClient() as c:
        await c.post(ready["base_url"] + "/_test/crash")
    failed = await svc.wait_state(view["id"], "failed", timeout=10)
    assert failed["state_reason"].startswith("engine exited (exit code 3)")
    assert svc.ctx.deployer.snapshot().held == 0


async def test_watchdog_catches_a_hung_engine(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path, deployer={"health_interval_s": 0.2, "health_failures": 3}))
    view = await svc.create(name="hung", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    pid = int(svc.ctx.deployer.get(view["id"]).runtime_handle.ref)
    os.kill(pid, signal.SIGSTOP)
    try:
        failed = await svc.wait_state(view["id"], "failed", timeout=15)
    finally:
        with contextlib.suppress(ProcessLookupError):  # dgxmm may have ended it already (it does, below)
            os.kill(pid, signal.SIGCONT)
    assert failed["state_reason"].startswith("health check failed 3 times in a row")
    # Failing a hung engine also stops it, so its memory is really free.
    await wait_until(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), timeout=10)


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    except OSError:
        return True


async def test_fit_check_refuses_a_start_that_does_not_fit(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path, memory={"capacity_gib": 10}))
    big = await svc.create(name="big", engine="command", memory_gib=8, command=engine_command())
    await svc.wait_state(big["id"], "ready")
    resp = await svc.client.post(
        "/api/deployments", json={"name": "other", "engine": "command", "memory_gib": 4, "command": engine_command()}
    )
    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "insufficient_memory"
    assert "needs 4 GiB, 2.0 GiB free" in resp.json()["error"]["message"]
    names = [d["name"] for d in (await svc.client.get("/api/deployments")).json()]
    assert names == ["big"], "a refused always-on deployment is not half-created"

    od = await svc.create(name="od", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    resp = await svc.client.post(f"/api/deployments/{od['id']}/start")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "insufficient_memory"
    assert (await svc.view(od["id"]))["state"] == "stopped"


@pytest.mark.bounded
async def test_second_start_waits_at_the_gate(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path, deployer={"max_concurrent_starts": 1}))
    first = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command("--start-delay", "5"))
    second = await svc.create(name="b", engine="command", memory_gib=1, command=engine_command())
    # While the first loads (5 s, from its launch: the checks below take milliseconds after it),
    # the second is starting but has no engine yet: it waits at the gate.
    await wait_until(lambda: svc.ctx.deployer.get(first["id"]).runtime_handle is not None)
    assert svc.ctx.deployer.get(second["id"]).runtime_handle is None
    assert (await svc.view(second["id"]))["state"] == "starting"
    await svc.wait_state(first["id"], "ready")
    await svc.wait_state(second["id"], "ready")
    a = svc.ctx.deployer.get(first["id"]).state_changed_at
    b = svc.ctx.deployer.get(second["id"]).state_changed_at
    assert a <= b
    texts = [e["text"] for e in svc.ctx.store.list_events(50, second["id"])]
    assert "Waiting for another engine to load" in texts


async def test_stop_during_start_cancels_it(serve) -> None:
    svc = await serve()
    view = await svc.create(name="s", engine="command", memory_gib=1, command=engine_command("--start-delay", "30"))
    await wait_until(lambda: svc.ctx.deployer.get(view["id"]).runtime_handle is not None)
    pid = int(svc.ctx.deployer.get(view["id"]).runtime_handle.ref)
    resp = await svc.client.post(f"/api/deployments/{view['id']}/stop")
    assert resp.json()["state"] == "stopped"
    await wait_until(lambda: _zombie(pid), timeout=10)


async def test_remove_stops_the_engine_and_forgets_it(serve) -> None:
    svc = await serve()
    view = await svc.create(name="r", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    pid = int(svc.ctx.deployer.get(view["id"]).runtime_handle.ref)
    resp = await svc.client.delete(f"/api/deployments/{view['id']}")
    assert resp.status_code == 200
    assert (await svc.client.get(f"/api/deployments/{view['id']}")).status_code == 404
    await wait_until(lambda: _zombie(pid), timeout=10)
    actions = [row["action"] for row in (await svc.client.get("/api/audit")).json()]
    assert "remove" in actions and "create" in actions


async def test_restart_of_dgxmm_restarts_always_on_and_not_on_demand(serve, tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    svc = await serve(settings)
    always = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command())
    od = await svc.create(name="o", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    await svc.client.post(f"/api/deployments/{od['id']}/start")
    await svc.wait_state(always["id"], "ready")
    await svc.wait_state(od["id"], "ready")
    pids = [int(svc.ctx.deployer.get(i).runtime_handle.ref) for i in (always["id"], od["id"])]
    await svc.shutdown()
    for pid in pids:  # no engine outlives dgxmm
        await wait_until(lambda pid=pid: _zombie(pid), timeout=10)

    svc2 = await serve(
        settings.model_copy(
            update={"server": settings.server.model_copy(update={"port": make_settings(tmp_path).server.port})}
        )
    )
    await svc2.wait_state(always["id"], "ready")
    assert (await svc2.view(od["id"]))["state"] == "stopped"


async def test_restart_applies_a_pending_switch_and_starts_it(serve, tmp_path: Path) -> None:
    """dgxmm stopped while a switch to always on waited for the start: after the restart the
    deployment is always on, and so it is started."""
    settings = make_settings(tmp_path)
    svc = await serve(settings)
    view = await svc.create(
        name="p", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--start-delay", "30")
    )
    resp = await svc.client.patch(f"/api/deployments/{view['id']}/mode", json={"mode": "always_on"})
    assert resp.json()["pending_mode"] == "always_on"
    await svc.shutdown()
    svc2 = await serve(
        settings.model_copy(
            update={"server": settings.server.model_copy(update={"port": make_settings(tmp_path).server.port})}
        )
    )
    after = await svc2.view(view["id"])
    assert (after["mode"], after["pending_mode"], after["state"]) == ("always_on", None, "starting")
