"""Read-only admin tokens (issue 37 item 4): a viewer token reads every GET of the admin API, the
event streams and the metrics, and is 403 ``forbidden`` on every change; the admin token file
stays the admin. Through the real service."""

from __future__ import annotations

from pathlib import Path

import httpx
from conftest import engine_command, gateway_settings, wait_until


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


async def viewer_of(svc) -> httpx.AsyncClient:
    made = await svc.client.post("/api/tokens", json={"name": "watcher", "role": "viewer"})
    assert made.status_code == 201, made.text
    return httpx.AsyncClient(base_url=svc.url, headers={"Authorization": f"Bearer {made.json()['token']}"}, timeout=30)


async def test_a_viewer_sees_the_names_of_env_variables_not_their_values(serve, tmp_path: Path) -> None:
    """Issue 47 item 7: tokens are often passed to engines in ``env``; a viewer reads the names
    (each value null) in the list, a deployment's view and the event stream's, the admin all."""
    svc = await serve(gateway_settings(tmp_path))
    secret = "hf_" + "s3cr3t" * 6
    view = await svc.create(
        name="m",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=engine_command(),
        env={"HF_TOKEN": secret, "PLAIN": "1"},
    )
    assert (await svc.view(view["id"]))["env"] == {"HF_TOKEN": secret, "PLAIN": "1"}
    async with await viewer_of(svc) as v:
        listed = (await v.get("/api/deployments")).json()
        one = (await v.get(f"/api/deployments/{view['id']}")).json()
        async with v.stream("GET", "/api/events") as events:
            first = ""
            async for line in events.aiter_lines():
                if line.startswith("data:"):
                    first = line
                    break
        # A change goes out live too: the stream's later deployment events are a viewer's as well.
        async with v.stream("GET", "/api/events") as events:
            await svc.client.patch(f"/api/deployments/{view['id']}", json={"memory_gib": 2})
            pushed = [line async for line in _lines_until(events, '"memory_gib": 2')]
    assert [d["env"] for d in listed] == [{"HF_TOKEN": None, "PLAIN": None}] == [one["env"]]
    assert '"HF_TOKEN": null' in first and secret not in first
    assert pushed and not any(secret in line for line in pushed)


async def _lines_until(events: httpx.Response, mark: str):
    async for line in events.aiter_lines():
        yield line
        if mark in line:
            return


async def test_head_is_answered_wherever_get_is(serve, tmp_path: Path) -> None:
    """Issue 47 item 7: every GET route of the admin API (its OpenAPI lists them) and the metrics
    answer HEAD with the GET's status and headers and no body, for the admin and a viewer; an
    event stream's HEAD ends at once and leaves no subscriber behind."""
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    schema = (await svc.client.get("/api/openapi.json")).json()
    paths = [
        path.removeprefix("/dgxmm").replace("{deployment_id}", view["id"])
        for path, methods in schema["paths"].items()
        if "get" in methods and "{" not in path.replace("{deployment_id}", "")
    ]
    assert "/api/deployments" in paths and "/api/events" in paths and len(paths) > 15
    async with await viewer_of(svc) as v:
        for client in (svc.client, v):
            for path in [*paths, "/metrics"]:
                head = await client.head(path)
                assert head.status_code != 404 and head.content == b"", (path, head.status_code)
                if not path.endswith(("/events", "/follow", "/stream")) and "text/event-stream" not in head.headers.get(
                    "content-type", ""
                ):
                    got = await client.get(path)
                    assert head.status_code == got.status_code, path
    await wait_until(lambda: not svc.ctx.bus._subscribers)  # a HEAD of an event stream leaves none behind
