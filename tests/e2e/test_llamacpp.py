"""End to end with a real inference engine: llama.cpp's llama-server on a tiny random model.

``make test`` builds llama-server once (scripts/build-llama-server.sh, cached outside the clone)
and passes its path as DGXMM_LLAMA_SERVER.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from conftest import caller, gateway_settings, wait_until

from dgxmm.demo.tiny_gguf import write_tiny_gguf
from dgxmm.deploy.sampler import Sample

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )


async def _stream(client: httpx.AsyncClient, url: str, body: dict, auth: dict[str, str] | None = None) -> list[dict]:
    chunks = []
    async with client.stream("POST", url, json=body, headers=auth) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
            elif line == "data: [DONE]":
                chunks.append({"done": True})
    return chunks


async def test_llamacpp_deployment_end_to_end(serve, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    settings = gateway_settings(tmp_path, engines={"llamacpp_bin": BIN}, deployer={"metrics_interval_s": 0.2})
    svc = await serve(settings)
    view = await svc.create(
        name="tiny", engine="llamacpp", model=str(model), memory_gib=1, args=["-c", "2048", "-np", "2"]
    )
    ready = await svc.wait_state(view["id"], "ready", timeout=60)

    body = {"model": "tiny", "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}
    async with httpx.AsyncClient(timeout=60) as c:
        # The engine's port is in its command line, for any local user to read: it demands the
        # key dgxmm gave this run of it, which no other user can read (docs/server.md).
        unkeyed = await c.post(ready["base_url"] + "/v1/chat/completions", json=body)
        assert unkeyed.status_code == 401, unkeyed.text
        chunks = await _stream(c, ready["base_url"] + "/v1/chat/completions", body, svc.engine_auth(view["id"]))
    assert chunks[-1] == {"done": True}
    assert any(ch.get("choices") and ch["choices"][0]["delta"].get("content") for ch in chunks[:-1])
    ended = time.monotonic()

    # The sampler reads llama.cpp's real metrics page. A sample read while the stream ran shows it
    # running; only one taken after the stream ended may show the engine idle (and the first such
    # one may have been requested mid-stream), so wait for an idle sample taken after the end.
    sampler = svc.ctx.sampler

    def idle_after_stream() -> Sample | None:
        sample = sampler.latest(view["id"])
        return sample if sample is not None and sample.time > ended and sample.idle else None

    await wait_until(idle_after_stream, timeout=10)

    resp = await svc.client.post(f"/api/deployments/{view['id']}/stop")
    assert resp.json()["state"] == "stopped"
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as client:
            await client.get(ready["base_url"] + "/health", timeout=2)


async def test_on_demand_cold_start_through_the_gateway(serve, tmp_path: Path) -> None:
    """A stopped on-demand llama.cpp model is started by its first request through the gateway,
    and the engine's stream comes back through it."""
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    svc = await serve(gateway_settings(tmp_path, engines={"llamacpp_bin": BIN}))
    view = await svc.create(
        name="tiny",
        engine="llamacpp",
        model=str(model),
        memory_gib=1,
        mode="on_demand",
        args=["-c", "2048", "-np", "2"],
    )
    assert view["state"] == "stopped"
    async with caller(svc, timeout=60) as g:
        chunks = await _stream(
            g,
            f"/{view['id']}/v1/chat/completions",
            {"model": "tiny", "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert chunks[-1] == {"done": True} and chunks[0]["object"] == "chat.completion.chunk"
    after = await svc.view(view["id"])
    assert after["state"] == "ready"
    assert after["ondemand"]["inflight"] == 0 and after["ondemand"]["last_request_at"]
    texts = [e["text"] for e in svc.ctx.store.list_events(100, view["id"])]
    assert "Started for a request" in texts
