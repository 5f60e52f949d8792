"""Usage per model and per caller key (issue 41 item 16, issue 37 item 3): requests, prompt and
completion tokens and errors today and in the last hour, counted as each request ends, the same
for a caller key (GET /api/keys), the key file, and a model (GET /api/activity/usage, a
deployment's history). Real traffic through the gateway, test engines as real processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, engine_command, gateway_settings

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
ZERO = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "errors": 0}


def router(svc: Any, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def summed(records: list[dict[str, Any]], failed: int) -> dict[str, int]:
    """What the activity log says these requests cost, as a usage entry counts it."""
    return {
        "requests": len(records),
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in records),
        "completion_tokens": sum(r["completion_tokens"] or 0 for r in records),
        "errors": failed,
    }


async def test_usage_per_model_and_per_key_from_real_traffic(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    good = await svc.create(
        name="good", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--reply", "a b c")
    )
    bad = await svc.create(
        name="bad", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--fail-start")
    )
    made = await svc.client.post("/api/keys", json={"name": "alice", "models": ["good", "bad"]})
    alice = made.json()["key"]
    async with router(svc, alice) as r:
        for _ in range(2):
            assert (await r.post("/chat/completions", json={**CHAT, "model": "good"})).status_code == 200
        failed = await r.post("/chat/completions", json={**CHAT, "model": "bad"})
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "start_failed"
        # refused before any model: an error of the key's, none of a model's
        refused = await r.post("/chat/completions", json={**CHAT, "model": "other"})
        assert refused.status_code == 404
    async with router(svc, KEY) as r:
        assert (await r.post("/chat/completions", json={**CHAT, "model": "good"})).status_code == 200

    activity = (await svc.client.get("/api/activity", params={"limit": 100})).json()
    by_alice = [row for row in activity if row["key"] == "alice"]
    on_good = [row for row in activity if row["deployment_id"] == good["id"]]
    assert len(by_alice) == 4 and len(on_good) == 3
    assert all(row["completion_tokens"] == 3 for row in on_good)
    alice_used = summed(by_alice, failed=2)

    [key] = (await svc.client.get("/api/keys")).json()
    assert key["usage"]["today"] == key["usage"]["last_hour"] == key["usage"]["total"] == alice_used

    usage = (await svc.client.get("/api/activity/usage")).json()
    assert usage["counted_since"] <= activity[-1]["time"]
    models = {row["name"]: row for row in usage["models"]}
    assert models["good"]["today"] == models["good"]["last_hour"] == summed(on_good, failed=0)
    assert models["bad"]["today"] == {"requests": 1, "prompt_tokens": 0, "completion_tokens": 0, "errors": 1}
    assert models["good"]["served_name"] == "good" and models["bad"]["deployment_id"] == bad["id"]
    keys = {row["name"]: row for row in usage["keys"]}
    assert [row["name"] for row in usage["keys"]] == ["key-file", "alice"]
    assert keys["alice"]["today"] == alice_used
    file_rows = [row for row in activity if row["key"] == "key-file"]
    assert keys["key-file"]["last_hour"] == summed(file_rows, failed=0) and file_rows

    history = (await svc.client.get(f"/api/deployments/{good['id']}/history")).json()
    assert history["usage"] == {"today": models["good"]["today"], "last_hour": models["good"]["last_hour"]}

    # A restart keeps a caller key's today and total; the last hour and the models' start again.
    await svc.shutdown()
    again = await serve(gateway_settings(tmp_path))
    [kept] = (await again.client.get("/api/keys")).json()
    assert kept["usage"]["today"] == kept["usage"]["total"] == alice_used and kept["usage"]["last_hour"] == ZERO
    after = (await again.client.get("/api/activity/usage")).json()
    assert all(row["today"] == ZERO for row in after["models"])
    assert after["keys"][0]["today"] == ZERO
