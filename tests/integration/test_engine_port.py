"""Engines only dgxmm can reach (issue 26): a local process that takes an engine's port before the
engine binds it (the port is in the engine's command line, readable by every user) is never taken
for the engine, and never gets a caller's prompt."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from conftest import caller, engine_command, gateway_settings, wait_until

pytestmark = pytest.mark.hostile  # issue 26's attacks: also run by `pytest -m hostile`


async def test_a_squatted_engine_port_never_gets_a_callers_prompt(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--listen-delay", "3")
    )
    seen: list[str] = []

    async def squat(request: web.Request) -> web.StreamResponse:
        seen.append(f"{request.method} {request.path}")
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        if request.path == "/health":
            return web.json_response({"status": "ok"})
        return web.json_response({"choices": [{"message": {"content": "the squatter's answer"}}]})

    async with caller(svc, timeout=30) as c:
        asking = asyncio.create_task(
            c.post(
                f"/{view['id']}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "secret"}]},
            )
        )
        # The port dgxmm gave the engine (a watcher reads it from the engine's command line).
        handle = await wait_until(lambda: (d := svc.ctx.deployer.peek(view["id"])) and d.runtime_handle)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", squat)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", handle.port).start()
        try:
            resp = await asking
        finally:
            await runner.cleanup()
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "start_failed"
    failed = await svc.wait_state(view["id"], "failed")
    assert failed["state_reason"].startswith(f"port {handle.port} is held by another process, not the engine")
    assert [line for line in seen if line.startswith("POST")] == []  # the prompt never went there
    assert "secret" not in resp.text and "squatter" not in resp.text
