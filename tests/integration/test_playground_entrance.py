"""The console's playground comes in through the gateway's one entrance (gateway/entrance.py):
its chat is counted in the gateway's share of the connections, and refused like any caller's
when the share is full, and the peer guard is the one check it skips (the admin token stands in
for it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import caller, engine_command, gateway_settings, wait_until

import dgxmm.app

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def test_the_playground_is_counted_in_the_gateways_share_and_skips_the_peer_guard(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = dgxmm.app.front_limits
    monkeypatch.setattr(  # a share of one gateway request
        dgxmm.app,
        "front_limits",
        lambda *a, **kw: dataclasses.replace(made(*a, **kw), max_connections=20, admin_reserve=19),
    )
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="m",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=engine_command("--reply", " ".join(["word"] * 12), "--chunk-delay", "0.3"),
    )
    playground = f"/api/deployments/{view['id']}/playground"

    async def gateway_requests() -> int:
        count: int = (await svc.client.get("/api/host")).json()["server"]["gateway_requests"]
        return count

    # The peer guard would refuse the playground's request: the browser's peer (127.0.0.1) is not
    # an allowed caller of the gateway, nor is the name the request carries ("console").
    async with caller(svc, address="127.0.0.1") as g:
        assert (await g.get(f"/{view['id']}/v1/models")).status_code == 404
    async with svc.client.stream("POST", playground, json=CHAT) as resp:
        assert resp.status_code == 200
        lines = resp.aiter_lines()
        assert (await anext(lines)).startswith("data: {")  # served: the guard did not apply
        assert await gateway_requests() == 1  # ... and it holds the gateway's one place
        async with caller(svc) as g:
            busy = await g.get(f"/{view['id']}/v1/models")
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "server_busy"
        rest = [line async for line in lines if line]
    assert rest[-1] == "data: [DONE]"

    async def share_free() -> bool:
        return await gateway_requests() == 0

    await wait_until(share_free, 10)  # its place given back as its answer ended

    # A caller's stream holds the share: the playground is refused as any caller would be.
    body = {"model": "m", "stream": True, "messages": []}
    async with caller(svc) as g, g.stream("POST", f"/{view['id']}/v1/chat/completions", json=body) as stream:
        assert (await anext(stream.aiter_lines())).startswith("data: {")
        refused = await svc.client.post(playground, json=CHAT)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_busy"
        assert refused.headers["retry-after"] == "1"
