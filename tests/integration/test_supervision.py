"""Background work under the supervisor, on the real service: a fault injected into each
long-lived task is logged with its traceback, recorded as an event and the task restarts; the
tasks and their health are listed in GET /api/host; and a killed engine leaves ``ready`` even
while what the watchdog leans on fails."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import engine_command, gateway_settings, wait_until
from engines.litellm_standin import StandIn

from dgxmm.deploy import watchdog


@pytest.fixture
async def litellm(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    lite = await StandIn().start()
    master = tmp_path / "litellm-master.key"
    master.write_text(lite.master_key + "\n")
    master.chmod(0o600)
    yield {"enabled": True, "url": lite.url, "master_key_file": master, "sync_interval_s": 0.2}
    await lite.stop()


async def service(serve, tmp_path: Path, litellm: dict[str, Any]):
    svc = await serve(
        gateway_settings(tmp_path, litellm=litellm, ondemand={"reaper_interval_s": 0.1, "peer_refresh_s": 0.1})
    )
    svc.ctx.supervisor.initial_backoff_s = 0.05
    view = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    return svc, view


async def tasks_of(svc) -> dict[str, dict[str, Any]]:
    host = (await svc.client.get("/api/host")).json()
    return {task["name"]: task for task in host["tasks"]}


async def test_host_lists_every_background_task_with_its_health(serve, tmp_path: Path, litellm) -> None:
    svc, view = await service(serve, tmp_path, litellm)
    tasks = await tasks_of(svc)
    assert set(tasks) == {
        "peer-refresh",
        "key-recheck",
        "litellm-sync",
        "metrics-sampler",
        "loop-lag",
        "ondemand-reaper",
        "live-status",
        "store-retry",
        "key-usage",
        f"watchdog-{view['id']}",
    }
    assert all(t["running"] and t["restarts"] == 0 and t["last_error"] is None for t in tasks.values())
    assert tasks[f"watchdog-{view['id']}"]["deployment_id"] == view["id"]
    await svc.client.post(f"/api/deployments/{view['id']}/stop")
    assert f"watchdog-{view['id']}" not in await tasks_of(svc)


def inject(svc, name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the callable task ``name`` leans on raise once, then behave; returns a call counter."""
    ctx = svc.ctx
    owner, attr = {
        "metrics-sampler": (ctx.sampler, "start_reads"),
        "ondemand-reaper": (ctx.ondemand, "reap_once"),
        "peer-refresh": (ctx.peers, "refresh"),
        "key-recheck": (ctx.keys, "current"),
        "litellm-sync": (ctx.litellm, "sync_once"),
        "live-status": (ctx.live, "check"),
        "watchdog": (watchdog.probe, "healthy"),
    }[name]
    original = getattr(owner, attr)
    calls = [0]

    def faulty(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError(f"injected into {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attr, faulty)
    return calls


@pytest.mark.parametrize(
    "name",
    ["metrics-sampler", "ondemand-reaper", "peer-refresh", "key-recheck", "litellm-sync", "live-status", "watchdog"],
)
async def test_a_fault_in_each_task_is_logged_recorded_and_the_task_restarts(
    serve, tmp_path: Path, litellm, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    svc, view = await service(serve, tmp_path, litellm)
    task = f"watchdog-{view['id']}" if name == "watchdog" else name
    with caplog.at_level(logging.ERROR, logger="dgxmm.supervisor"):
        calls = inject(svc, name, monkeypatch)
        if name == "live-status":
            # It checks only when told of a change or when a status is due to change with time,
            # and a ready always-on model has neither: tell it of one, as any change of it would
            # (waiting for some other change failed once in a CI run, after 20 s).
            svc.ctx.live.mark(view["id"])
        await wait_until(lambda: calls[0] >= 2, timeout=20)  # failed once, then ran again
    [record] = [r for r in caplog.records if f"background task {task} failed" in r.getMessage()]
    assert record.exc_info is not None and "injected into" in str(record.exc_info[1])
    events = (await svc.client.get("/api/events/history")).json()
    assert any(
        e["actor"] == "supervisor"
        and e["text"].startswith(f"Background task {task} failed: RuntimeError: injected into {name}; restarting in")
        for e in events
    )
    health = (await tasks_of(svc))[task]
    assert health["restarts"] == 1 and health["last_error"] == f"RuntimeError: injected into {name}"
    assert health["running"]


def kill(pid: int) -> None:
    os.killpg(pid, signal.SIGKILL)


@pytest.mark.hostile
async def test_a_killed_engine_leaves_ready_while_its_log_folder_is_unreadable(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    logs = svc.settings.server.data_dir / "logs"
    logs.rename(logs.with_name("logs.away"))
    logs.write_text("not a folder")  # (as root a chmod would not stop the read)
    kill(int(svc.ctx.deployer.get(view["id"]).runtime_handle.ref))
    failed = await svc.wait_state(view["id"], "failed", timeout=20)
    reason = failed["state_reason"]
    assert reason.startswith("engine exited (killed by SIGKILL)")
    assert "the engine's log cannot be read: NotADirectoryError" in reason
    assert f"watchdog-{view['id']}" not in await tasks_of(svc)
    assert svc.ctx.deployer.snapshot().held == 0  # its memory is free again


@pytest.mark.hostile
async def test_a_killed_engine_leaves_ready_when_the_runtime_cannot_wait_for_it(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = await serve(gateway_settings(tmp_path))

    async def broken(deployment_id: str) -> str:
        raise RuntimeError("lost the process table")

    monkeypatch.setattr(svc.ctx.deployer.runtime, "wait_exit", broken)
    view = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    kill(int(svc.ctx.deployer.get(view["id"]).runtime_handle.ref))
    failed = await svc.wait_state(view["id"], "failed", timeout=20)
    assert failed["state_reason"].startswith("health check failed 3 times in a row")


@pytest.mark.hostile
async def test_a_failing_event_store_does_not_keep_a_dead_engine_ready(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    original = svc.ctx.bus.event

    def event(actor: str, deployment_id: str | None, text: str) -> Any:
        if text.startswith("Failed"):
            raise OSError(24, "Too many open files")
        return original(actor, deployment_id, text)

    monkeypatch.setattr(svc.ctx.bus, "event", event)
    kill(int(svc.ctx.deployer.get(view["id"]).runtime_handle.ref))
    await svc.wait_state(view["id"], "failed", timeout=20)
    await wait_until(lambda: svc.ctx.deployer.snapshot().held == 0)  # and it was stopped after
