"""A real llama-server's model file out of the page cache once it stops, on unified memory
(issue 40 item 2): with ``[memory] source = "meminfo"`` its pages are gone when the stop is
recorded, before any next start's fit check; with ``page_cache = "keep"`` they stay. Pages are
counted by ``fincore`` (util-linux), as a user would check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import gateway_settings

from dgxmm.demo.tiny_gguf import write_random_gguf

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )


def cached(path: Path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


@pytest.mark.parametrize(("policy", "released"), [("auto", True), ("keep", False)])
async def test_a_stopped_engines_model_leaves_the_page_cache_on_unified_memory(
    serve, tmp_path: Path, policy: str, released: bool
) -> None:
    model = write_random_gguf(tmp_path / "m.gguf", n_embd=256, n_ff=688, n_layer=24)  # about 80 MB
    with model.open("rb") as f:
        os.fsync(f.fileno())  # (written back, as a model file is: the kernel drops clean pages only)
    size = model.stat().st_size
    settings = gateway_settings(
        tmp_path,
        engines={"llamacpp_bin": BIN},
        memory={"source": "meminfo", "capacity_gib": None, "page_cache": policy},
    )
    svc = await serve(settings)
    view = await svc.create(name="m", engine="llamacpp", model=str(model), memory_gib=1, args=["-c", "512"])
    await svc.wait_state(view["id"], "ready", timeout=60)
    assert cached(model) >= 0.9 * size  # llama-server read every weight in
    resp = await svc.client.post(f"/api/deployments/{view['id']}/stop")
    assert resp.status_code == 200, resp.text
    assert (await svc.view(view["id"]))["state"] == "stopped"
    if released:
        assert cached(model) <= 0.02 * size  # gone by the time the stop is recorded
    else:
        assert cached(model) >= 0.9 * size
