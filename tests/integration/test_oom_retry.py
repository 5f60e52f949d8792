"""A start that runs out of memory, through the real service: the test engine writes PyTorch's
out-of-memory line and exits on its first start(s) (``--oom-starts``), a request waits for it;
the controller makes room once and starts it again (controller/oomretry.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import caller, engine_command, gateway_settings, wait_until
from integration.test_gateway_checks import CHAT

from dgxmm.controller import texts
from dgxmm.records.deployment import State


async def served_with_an_idle_model(
    serve: Any, tmp_path: Path, ooms: int
) -> tuple[Any, dict[str, Any], dict[str, Any], Path]:
    """10 GiB; v (6 GiB) ready and idle by make-room's rule; x (4 GiB, stopped) fits beside it
    by the budget, and its engine runs out of memory on its first ``ooms`` starts."""
    settings = gateway_settings(
        tmp_path, memory={"capacity_gib": 10}, ondemand={"reaper_interval_s": 3600, "idle_timeout_min_s": 0.5}
    )
    svc = await serve(settings)
    counter = tmp_path / "ooms"
    counter.write_text(str(ooms))
    create = {"engine": "command", "mode": "on_demand", "idle_timeout_s": 1}
    v = await svc.create(name="v", memory_gib=6, command=engine_command(), **create)
    x = await svc.create(name="x", memory_gib=4, command=engine_command("--oom-starts", str(counter)), **create)
    await svc.client.post(f"/api/deployments/{v['id']}/start")
    await svc.wait_state(v["id"], "ready")
    controller, deployer = svc.ctx.ondemand, svc.ctx.deployer
    await wait_until(lambda: controller.is_idle(deployer.get(v["id"])))  # idle 1 s, fresh sample
    return svc, v, x, counter


def events(svc: Any, deployment_id: str) -> list[str]:
    return [row["text"] for row in svc.ctx.store.list_events(100, deployment_id)]


async def test_a_start_that_runs_out_of_memory_makes_room_once_and_the_request_is_answered(
    serve: Any, tmp_path: Path
) -> None:
    svc, v, x, counter = await served_with_an_idle_model(serve, tmp_path, ooms=1)
    async with caller(svc, timeout=60) as gateway:
        reply = await gateway.post(f"/{x['id']}/v1/chat/completions", json=CHAT)
    assert reply.status_code == 200, reply.text
    assert counter.read_text() == "0"  # its engine ran out of memory once, then started
    deployer = svc.ctx.deployer
    assert deployer.get(x["id"]).state is State.READY
    assert deployer.get(v["id"]).state is State.STOPPED  # stopped for x's shortfall
    assert "Stopped to make room for x" in events(svc, v["id"])
    x_events = events(svc, x["id"])
    assert texts.OOM_RETRY in x_events
    assert any(text.startswith("Failed: ") for text in x_events)  # the first start's failure is recorded
    track = svc.ctx.ondemand.state.tracks[x["id"]]
    assert track.backoff_s == 0.0 and track.refused_until == 0.0  # no backoff was counted


async def test_a_start_that_runs_out_of_memory_twice_is_a_failed_start_with_backoff(serve: Any, tmp_path: Path) -> None:
    svc, v, x, counter = await served_with_an_idle_model(serve, tmp_path, ooms=2)
    async with caller(svc, timeout=60) as gateway:
        failed = await gateway.post(f"/{x['id']}/v1/chat/completions", json=CHAT)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "start_failed", failed.text
        refused = await gateway.post(f"/{x['id']}/v1/chat/completions", json=CHAT)  # within the backoff: at once
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "start_failed", refused.text
    assert counter.read_text() == "0"  # two starts, both out of memory: no third
    assert texts.OOM_RETRY in events(svc, x["id"])  # the first was retried
    assert svc.ctx.deployer.get(x["id"]).state is State.FAILED
    track = svc.ctx.ondemand.state.tracks[x["id"]]
    assert track.backoff_s == svc.ctx.settings.ondemand.backoff_initial_s and track.refused_until > 0
