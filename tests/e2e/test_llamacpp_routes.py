"""llama-server's own routes through dgxmm's router (issue 50 item 6): ``/completion``,
``/infill`` and ``/reranking`` at the listener's root, and ``/v1/reranking``, each reaching a real
llama-server by the body's ``model``, the first one through a cold start. The tiny model the test
writes has no fill-in-the-middle tokens and the engine runs without ``--reranking``: for those
two, the answer is llama-server's own refusal, status and body as the engine gives them (what the
issue asks of a route an engine cannot serve); ``/completion`` is a real generation."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from conftest import KEY, gateway_settings

from dgxmm.demo.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )


async def test_llama_servers_own_routes_reach_it_by_model_cold_start_included(serve, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    svc = await serve(gateway_settings(tmp_path, engines={"llamacpp_bin": BIN}))
    view = await svc.create(
        name="tiny", engine="llamacpp", model=str(model), memory_gib=1, mode="on_demand", args=["-c", "2048"]
    )
    assert view["state"] == "stopped"
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    ) as r:
        done = await r.post("/completion", json={"model": "tiny", "prompt": "hi", "n_predict": 4})  # a cold start
        assert done.status_code == 200, done.text
        answer = done.json()
        assert answer["tokens_predicted"] == 4 and isinstance(answer["content"], str)
        assert answer["timings"]["predicted_n"] == 4  # llama-server's own figures

        infill = await r.post("/infill", json={"model": "tiny", "input_prefix": "def f(", "input_suffix": ")"})
        assert infill.status_code == 501
        assert infill.json()["error"]["type"] == "not_supported_error"
        assert "Infill is not supported by this model" in infill.json()["error"]["message"]

        for path in ("/reranking", "/v1/reranking"):
            ranked = await r.post(path, json={"model": "tiny", "query": "a", "documents": ["b", "c"]})
            assert ranked.status_code == 501, (path, ranked.text)
            assert "does not support reranking" in ranked.json()["error"]["message"]
    assert (await svc.view(view["id"]))["state"] == "ready"
