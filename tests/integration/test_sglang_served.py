"""An ``sglang`` deployment started and sampled through a served dgxmm, with the suite's SGLang
stand-in (the test engine behind SGLang's command line and metric names; SGLang itself needs a GPU,
and its parser checks dgxmm's flags in tests/sglang)."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import TESTS, make_settings, wait_until

FAKE_SGLANG = TESTS / "engines" / "fakesglang"


async def test_an_sglang_deployment_starts_with_its_share_and_is_idle_by_its_own_metrics(serve, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, memory={"capacity_gib": 128}, engines={"sglang_python": sys.executable})
    svc = await serve(settings)
    view = await svc.create(
        name="sgl", engine="sglang", model="/models/qwen", memory_gib=32, env={"PYTHONPATH": str(FAKE_SGLANG)}
    )
    dep_id = view["id"]
    await svc.wait_state(dep_id, "ready")
    handle = svc.ctx.deployer.get(dep_id).runtime_handle
    argv = Path(f"/proc/{handle.ref}/cmdline").read_bytes().decode().split("\0")
    assert argv[1:3] == ["-m", "sglang.launch_server"] and "--enable-metrics" in argv
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.25"

    sample = await wait_until(lambda: svc.ctx.sampler.latest(dep_id), timeout=10)
    assert sample.idle and (sample.running, sample.waiting) == (0, 0)
    assert not (settings.server.data_dir / "compile-cache").exists()  # vLLM's alone
