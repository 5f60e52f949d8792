"""1000 mixed chat completions through the gateway to a real llama-server (process runtime): all
answered 200, each run by the engine exactly once (see tests/e2e/llama_traffic.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import gateway_settings
from e2e.llama_traffic import ARGS, run_traffic

from dgxmm.demo.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )


async def test_1000_mixed_requests_process_runtime(serve, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    svc = await serve(gateway_settings(tmp_path, engines={"llamacpp_bin": BIN}))
    view = await svc.create(name="tiny", engine="llamacpp", model=str(model), memory_gib=1, args=ARGS)
    log = svc.settings.server.data_dir / "logs" / f"{view['id']}.log"
    await run_traffic(svc, view, log.read_text)
