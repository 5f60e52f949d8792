"""Make-room through the real service: real engines, real signals, the gateway's sockets."""

from __future__ import annotations

import pytest

import asyncio
import time
from pathlib import Path

from conftest import caller, engine_command, gateway_settings, wait_until
from integration.test_gateway_checks import CHAT

from dgxmm.records.changes import Change
from dgxmm.records.deployment import State


@pytest.mark.bounded
async def test_a_model_that_fits_is_served_while_another_waits_for_its_victim(serve, tmp_path: Path) -> None:
    """v's engine ignores SIGTERM, so its stop takes the 10 s grace before SIGKILL. x needs v's
    memory, so x's make-room waits for that stop; s fits in what is free and must not wait: its
    first byte comes within its own start time plus 1 s, while v is still stopping. x is served
    once v's memory is back."""
    settings = gateway_settings(
        tmp_path,
        memory={"capacity_gib": 10},
        deployer={"stop_grace_s": 10},
        ondemand={"reaper_interval_s": 3600, "idle_timeout_min_s": 0.5},
    )
    svc = await serve(settings)
    create = {"engine": "command", "mode": "on_demand", "idle_timeout_s": 1}
    v = await svc.create(name="v", memory_gib=6, command=engine_command("--ignore-sigterm"), **create)
    x = await svc.create(name="x", memory_gib=8, command=engine_command(), **create)
    s = await svc.create(name="s", memory_gib=2, command=engine_command(), **create)
    await svc.client.post(f"/api/deployments/{v['id']}/start")
    await svc.wait_state(v["id"], "ready")
    controller, deployer = svc.ctx.ondemand, svc.ctx.deployer
    await wait_until(lambda: controller.is_idle(deployer.get(v["id"])))  # idle 1 s, fresh sample

    times: dict[tuple[str, State], float] = {}

    def note(change: Change) -> None:
        if change.kind == "state":
            times[(change.deployment.id, change.deployment.state)] = time.monotonic()

    deployer.add_listener(note)
    async with caller(svc, timeout=60) as g:
        x_answer = asyncio.create_task(g.post(f"/{x['id']}/v1/chat/completions", json=CHAT))
        await wait_until(lambda: deployer.get(v["id"]).state is State.STOPPING)
        asked = time.monotonic()
        async with g.stream("POST", f"/{s['id']}/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            chunks = resp.aiter_raw()
            first = await chunks.__anext__()
            first_byte = time.monotonic() - asked
            v_state_then = deployer.get(v["id"]).state
            rest = b"".join([chunk async for chunk in chunks])
        assert resp.status_code == 200 and (first + rest).endswith(b"data: [DONE]\n\n")
        start_time = times[(s["id"], State.READY)] - times[(s["id"], State.STARTING)]
        assert v_state_then is State.STOPPING, "s waited for v's stop"
        assert first_byte <= start_time + 1.0, f"first byte after {first_byte:.2f} s, start took {start_time:.2f} s"
        reply = await x_answer
    assert reply.status_code == 200, reply.text
    assert times[(x["id"], State.STARTING)] >= times[(v["id"], State.STOPPED)]
    assert times[(v["id"], State.STOPPED)] - times[(v["id"], State.STOPPING)] >= 10
    events = [row["text"] for row in svc.ctx.store.list_events(100, v["id"])]
    assert "Stopped to make room for x" in events
    assert "Stopped" not in events  # one event per stop (issue 41), the one that says why
