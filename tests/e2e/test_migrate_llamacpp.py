"""Imported models on llama.cpp's llama-server (issue 51's "done when"): a llama-swap model whose
``cmd`` runs llama-server on a tiny GGUF, and an Ollama tag whose model layer is that GGUF as a
blob, both answer through ``/v1`` by the names llama-swap and Ollama gave them, the blob served
where Ollama keeps it.

``make test`` builds llama-server once and passes its path as DGXMM_LLAMA_SERVER.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, gateway_settings

from dgxmm.cli import main
from dgxmm.declared.plan import declared_id
from dgxmm.demo.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )


def imported(*argv: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["import", *argv])
    assert exited.value.code == 0


async def test_imported_llama_swap_and_ollama_models_answer_on_llama_server(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DGXMM_CONFIG", raising=False)
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    config = tmp_path / "llama-swap.yaml"
    config.write_text(f'models:\n  "swapped":\n    cmd: llama-server -m {model} --port ${{PORT}} -c 256 -np 1\n')
    store = tmp_path / "ollama"
    (store / "blobs").mkdir(parents=True)
    data = model.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (store / "blobs" / f"sha256-{digest}").write_bytes(data)
    layer = {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)}
    tags = store / "manifests" / "registry.ollama.ai" / "library" / "tiny"
    tags.mkdir(parents=True)
    (tags / "latest").write_text(json.dumps({"schemaVersion": 2, "config": layer, "layers": [layer]}))
    folder = tmp_path / "deployments.d"
    imported("llama-swap", str(config), "--out", str(folder))
    imported("ollama", "--models", str(store), "--out", str(folder))
    svc = await serve(gateway_settings(tmp_path, engines={"llamacpp_bin": BIN}, server={"deployments_dir": folder}))
    assert (await svc.view(declared_id("tiny-latest")))["model"] == str(store / "blobs" / f"sha256-{digest}")
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=90,
    ) as v1:
        for name in ("swapped", "tiny:latest", "tiny"):
            body = {"model": name, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
            resp = await v1.post("/chat/completions", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["message"]["role"] == "assistant"
