"""A served dgxmm prefetches a queued model's file while it waits for room (issue 40): a stream
to ``a`` holds the one model's room; ``b`` (a real llama-server on a GGUF, out of the page cache)
is asked for and waits; its file is read meanwhile, so when ``b`` is answered the scrape counts
exactly its bytes, and with ``[memory] prefetch = false`` there is no such series. The activity
row of b's request says the load it waited for: llama-server's, with the whole file in the page
cache as the start began when prefetched, next to none of it when not."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import httpx
from conftest import KEY, engine_command, gateway_settings

from dgxmm.deploy.pagecache import drop
from dgxmm.demo.tiny_gguf import write_random_gguf

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )


def chat(model: str, max_tokens: int) -> dict:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("prefetch", [True, False])
async def test_a_waiting_models_file_is_prefetched(serve, tmp_path: Path, prefetch: bool) -> None:
    model = write_random_gguf(tmp_path / "b.gguf", n_embd=256, n_ff=688, n_layer=8)
    settings = gateway_settings(
        tmp_path,
        engines={"llamacpp_bin": BIN},
        memory={"capacity_gib": 1.5, "prefetch": prefetch},
        ondemand={"evict_idle_s": 0, "max_drain_wait_s": 0, "stop_settle_s": 0},
    )
    svc = await serve(settings)
    slow = engine_command("--chunk-delay", "0.1", "--reply", " ".join(["w"] * 20))  # a stream of 2 s
    await svc.create(name="a", engine="command", memory_gib=1, mode="on_demand", command=slow)
    await svc.create(name="b", engine="llamacpp", model=str(model), memory_gib=1, mode="on_demand", args=["-c", "256"])
    with model.open("rb") as f:
        os.fsync(f.fileno())  # (written back: the kernel drops clean pages only)
    drop([model])  # out of the page cache, as a model not used for a while (its header was read at the create)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    ) as g:  # (the model router, by name)
        assert (await g.post("/v1/chat/completions", json=chat("a", 1))).status_code == 200  # a is up
        held = asyncio.create_task(g.post("/v1/chat/completions", json={**chat("a", 20), "stream": True}))
        await asyncio.sleep(0.3)  # (a's stream under way: b must wait for it)
        answered = await g.post("/v1/chat/completions", json=chat("b", 2))
        assert answered.status_code == 200, answered.text
        assert (await held).status_code == 200
    page = (await svc.client.get("/metrics")).text
    lines = [line for line in page.splitlines() if line.startswith("dgxmm_prefetch_bytes_total")]
    if prefetch:
        assert len(lines) == 1 and float(lines[0].split()[1]) == model.stat().st_size, lines
    else:
        assert lines == []
    row = (await svc.client.get("/api/activity?deployment=b")).json()[0]
    assert row["cold_start"] and 0 < row["load_s"] < row["queued_s"], row
    if prefetch:
        assert row["cached_fraction"] >= 0.95, row
    else:
        assert row["cached_fraction"] < 0.1, row
