"""llama.cpp's ``GET /models/sse`` at the listener's root (issue 50 item 4): each change of a
model's load state as llama.cpp's router streams it (``{"model", "event": "model_status",
"data": {"status"}}`` in each record's data line), for the caller key's models only, fed from
dgxmm's event bus. Real sockets, test engines as processes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from conftest import gateway_settings, wait_until
from test_model_management import on_demand, root


async def test_the_stream_tells_each_load_state_change_of_the_caller_key_s_models(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    mine, other = await on_demand(svc, "mine"), await on_demand(svc, "other")
    made = await svc.client.post("/api/keys", json={"name": "one-model", "models": ["mine"]})
    assert made.status_code == 201, made.text
    seen: list[dict[str, Any]] = []
    async with root(svc, made.json()["key"]) as caller, root(svc) as admin:
        async with caller.stream("GET", "/models/sse") as stream:
            assert stream.status_code == 200 and stream.headers["content-type"] == "text/event-stream"

            async def read() -> None:
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))

            reader = asyncio.create_task(read())
            assert (await admin.post("/models/load", json={"model": "other"})).status_code == 200
            assert (await caller.post("/models/load", json={"model": "mine"})).status_code == 200
            assert (await caller.post("/models/unload", json={"model": "mine"})).status_code == 200
            await svc.wait_state(mine["id"], "stopped")
            await wait_until(lambda: seen and seen[-1]["data"]["status"] == "unloaded")
            reader.cancel()
    async with root(svc, "sk-wrong") as wrong:
        refused = await wrong.get("/models/sse")
    assert seen == [
        {"model": "mine", "event": "model_status", "data": {"status": value}}
        for value in ("loading", "loaded", "unloaded")
    ]  # nothing of "other", a model the key may not call
    assert (await svc.view(other["id"]))["state"] == "ready"
    assert refused.status_code == 401
