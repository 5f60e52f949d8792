"""A swap with the test engine through the model router (issue 40): the activity row of the
request that waited for the swap says the engine's load and how much of the model's file was in
the page cache as the start began; a model whose file cannot be prefetched (a FIFO) is said once
in dgxmm's log and its start goes on as ever, with its cached share unknown."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, engine_command, gateway_settings

pytestmark = pytest.mark.timeout(120)


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_swap_to_a_model_that_cannot_be_prefetched_goes_on_and_its_row_says_the_load(
    serve: Any, tmp_path: Path
) -> None:
    os.mkfifo(tmp_path / "b.gguf")  # (no writer: reading it would hang)
    svc = await serve(
        gateway_settings(
            tmp_path,
            memory={"capacity_gib": 4},
            ondemand={"evict_idle_s": 0, "stop_settle_s": 0},
            deployer={"metrics_interval_s": 0.2},
        )
    )
    await svc.create(name="a", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    await svc.create(
        name="b",
        engine="command",
        model=str(tmp_path / "b.gguf"),
        memory_gib=4,
        mode="on_demand",
        command=engine_command("--start-delay", "0.5"),
    )
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        timeout=60,
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
    ) as r:
        assert (await r.post("/chat/completions", json=chat("a"))).status_code == 200
        assert (await r.post("/chat/completions", json=chat("b"))).status_code == 200  # a stops for it
        assert (await r.post("/chat/completions", json=chat("a"))).status_code == 200  # and b for a
        assert (await r.post("/chat/completions", json=chat("b"))).status_code == 200
    rows = (await svc.client.get("/api/activity?deployment=b")).json()
    assert [(row["cold_start"], row["cached_fraction"]) for row in rows] == [(True, None), (True, None)]
    assert all(row["load_s"] >= 0.5 for row in rows), rows  # its launch to ready: the engine's start delay
    said = (await svc.client.get("/api/log?level=warning&q=prefetched")).json()
    lines = [line["message"] for line in said]
    assert lines == [f"{tmp_path / 'b.gguf'} is not prefetched: not a regular file"], lines
