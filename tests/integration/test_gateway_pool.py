"""A deployment's own gateway pool (issue 14, docs/configuration.md "upstream_max_connections"):
set through the API, it bounds how many requests the gateway runs on that engine at once; the
others wait for a pooled connection and are all answered."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import caller, engine_command, gateway_settings
from integration.test_gateway_checks import clear_requests, engine_requests, error_of
from integration.test_gateway_engine_connections import connection_counts

from dgxmm.front.limits import CONNECTION_CEILING

STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}


async def test_a_deployments_own_pool_bounds_its_concurrent_requests(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="m",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        upstream_max_connections=2,
        command=engine_command("--chunk-delay", "0.01"),
    )
    assert view["upstream_max_connections"] == 2
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    view = await svc.wait_state(view["id"], "ready")
    await clear_requests(view)
    async with caller(svc, timeout=60) as g:

        async def one() -> tuple[int, bytes]:
            resp = await g.post(f"/{view['id']}/v1/chat/completions", json=STREAM)
            return resp.status_code, resp.content

        answers = await asyncio.gather(*(one() for _ in range(8)))
    assert [status for status, _ in answers] == [200] * 8
    assert all(body.endswith(b"data: [DONE]\n\n") for _, body in answers)
    assert len([r for r in await engine_requests(view) if r["path"] == "/v1/chat/completions"]) == 8
    assert (await connection_counts(view))["most_chats"] == 2


async def test_the_pool_size_is_checked_and_can_be_changed(serve) -> None:
    svc = await serve()
    for bad in (0, CONNECTION_CEILING + 1):
        resp = await svc.client.post(
            "/api/deployments",
            json={
                "name": "m",
                "engine": "command",
                "memory_gib": 1,
                "command": engine_command(),
                "upstream_max_connections": bad,
            },
        )
        assert resp.status_code == 422 and "upstream_max_connections" in error_of(resp)["message"]
    view = await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    assert view["upstream_max_connections"] is None  # [ondemand] upstream_max_connections applies
    resp = await svc.client.patch(f"/api/deployments/{view['id']}", json={"upstream_max_connections": 1024})
    assert resp.status_code == 200 and resp.json()["upstream_max_connections"] == 1024
    resp = await svc.client.patch(f"/api/deployments/{view['id']}", json={"upstream_max_connections": 0})
    assert resp.status_code == 422
