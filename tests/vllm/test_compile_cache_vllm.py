"""The real vLLM (CPU build) started twice through dgxmm: the second cold start finds the compiled
model the first one saved in the cache dgxmm keeps (docs/engines.md#compile-cache), by vLLM's own
log lines. Run by ``make test-vllm``; about two cold starts of a few minutes each on two cores."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import gateway_settings
from test_real_vllm import ENGINE_ENV, tiny_model  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(1500)]

VLLM_PYTHON = os.environ["DGXMM_VLLM_PYTHON"]
# Without --enforce-eager, so that vLLM compiles the model (torch.compile, its AOT artifact).
ARGS = ["--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "1"]
SAVED = "saved AOT compiled function to "
LOADED = "Directly load AOT compilation from path "
LOAD_FAILED = "Compiling model again due to a load failure from "


async def cold_start(svc: Any, dep_id: str) -> tuple[float, list[str]]:
    """Start, wait until ready, stop: the seconds to ready and that run's log lines."""
    began = time.monotonic()
    assert (await svc.client.post(f"/api/deployments/{dep_id}/start")).status_code == 200
    await svc.wait_state(dep_id, "ready", timeout=900)
    took = time.monotonic() - began
    assert (await svc.client.post(f"/api/deployments/{dep_id}/stop")).status_code == 200
    lines = (await svc.client.get(f"/api/deployments/{dep_id}/logs", params={"tail": 10000})).json()["lines"]
    start = max(i for i, line in enumerate(lines) if line.startswith("--- dgxmm: starting"))
    return took, lines[start:]


def after(lines: list[str], marker: str) -> list[str]:
    return [line.split(marker, 1)[1].split(",", 1)[0] for line in lines if marker in line]


async def test_the_second_cold_start_finds_the_first_ones_compiled_model(
    serve: Any,
    tiny_model: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = gateway_settings(
        tmp_path,
        engines={"vllm_python": VLLM_PYTHON, "vllm_build": "cpu"},
        memory={"source": "declared", "capacity_gib": 16},
        deployer={"start_timeout_s": 900, "stop_grace_s": 20},
    )
    svc = await serve(settings)
    view = await svc.create(
        name="tiny", engine="vllm", model=str(tiny_model), memory_gib=3, mode="on_demand", args=ARGS, env=ENGINE_ENV
    )
    dep_id = view["id"]
    first_s, first = await cold_start(svc, dep_id)
    kept = settings.server.data_dir / "compile-cache" / dep_id
    saved = after(first, SAVED)
    assert saved and all(path.startswith(f"{kept}/") for path in saved), first[-40:]
    size = (await svc.client.get(f"/api/deployments/{dep_id}/compile-cache")).json()["bytes"]
    assert size > 0

    second_s, second = await cold_start(svc, dep_id)
    found = after(second, LOADED) + after(second, LOAD_FAILED)
    assert found and set(found) <= set(saved), "the second start did not look in the kept entry"
    failures = [line.split("reason: ", 1)[-1] for line in second if LOAD_FAILED in line]
    outcome = f"found it but compiled again ({failures[0]})" if failures else "loaded it"
    with capsys.disabled():  # the figures docs/engines.md quotes
        print(
            f"\ncompile cache, vLLM CPU build: first cold start {first_s:.0f} s, second {second_s:.0f} s, "
            f"entry {size / 2**20:.1f} MiB; the second start {outcome}"
        )
