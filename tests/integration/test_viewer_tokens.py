"""Read-only admin tokens (issue 37 item 4): a viewer token reads every GET of the admin API, the
event streams and the metrics, and is 403 ``forbidden`` on every change; the admin token file
stays the admin. Through the real service."""

from __future__ import annotations

from pathlib import Path

import httpx
from conftest import engine_command, gateway_settings


async def test_a_viewer_reads_and_changes_nothing(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    made = await svc.client.post("/api/tokens", json={"name": "dashboard", "role": "viewer"})
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    async with httpx.AsyncClient(base_url=svc.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as v:
        assert (await v.get("/api/deployments")).status_code == 200
        assert (await v.get("/api/host")).json()["role"] == "viewer"  # the console offers no change
        assert (await v.get(f"/api/deployments/{view['id']}")).status_code == 200
        assert (await v.get("/api/keys")).status_code == 200
        assert (await v.get("/api/activity")).status_code == 200
        assert (await v.get("/metrics")).status_code == 200
        async with v.stream("GET", "/api/events") as events:
            assert events.status_code == 200
        changes = [
            v.post(f"/api/deployments/{view['id']}/start"),
            v.post(f"/api/deployments/{view['id']}/stop"),
            v.post("/api/deployments", json={"name": "x"}),
            v.patch(f"/api/deployments/{view['id']}", json={"memory_gib": 2}),
            v.delete(f"/api/deployments/{view['id']}"),
            v.post("/api/keys", json={"name": "k"}),
            v.post("/api/tokens", json={"name": "again", "role": "viewer"}),
            v.post(f"/api/deployments/{view['id']}/playground", json={"messages": []}),
        ]
        for change in changes:
            resp = await change
            assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden", resp.text
    assert (await svc.view(view["id"]))["state"] == "stopped", "nothing started"
    assert (await svc.client.get("/api/host")).json()["role"] == "admin"
    assert [k["name"] for k in (await svc.client.get("/api/tokens")).json()] == ["dashboard"]
    bad = await svc.client.post("/api/tokens", json={"name": "x", "role": "admin"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "role"
    data = tmp_path / "data"
    assert all(token.encode() not in (data / name).read_bytes() for name in ("dgxmm.db", "dgxmm.db-wal"))
    revoked = await svc.client.delete(f"/api/tokens/{made.json()['id']}")
    assert revoked.status_code == 204
    async with httpx.AsyncClient(base_url=svc.url, headers={"Authorization": f"Bearer {token}"}) as v:
        assert (await v.get("/api/deployments")).status_code == 401
