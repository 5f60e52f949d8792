"""The demo's steps against the real service, without llama-server (the deployment is on demand
and never started here): dgxmm started without the model declared in a fresh clone's
examples/deployments.d/demo.toml, a ``demo`` an earlier demo made through the API in the way; the
demo writes the model where the declaration points, removes the old one, and waits until dgxmm
has created the declared one (tests/e2e/test_demo.py runs the whole demo with llama-server)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import engine_command, make_settings, wait_until

from dgxmm.declared.plan import declared_id
from dgxmm.demo.cold_start import Demo

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_the_demo_writes_the_declared_model_and_waits_for_dgxmm_to_apply_it(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(EXAMPLES / "deployments.d", tmp_path / "examples" / "deployments.d")
    monkeypatch.chdir(tmp_path)  # relative paths as `make run` has them, from the clone's root
    settings = make_settings(
        tmp_path,
        server={"data_dir": Path("data"), "deployments_dir": Path("examples/deployments.d"), "deployments_poll_s": 0.1},
    )
    svc = await serve(settings)
    error = svc.ctx.config_status()["error"]
    assert (error["field"], error["recheck"]) == ("model", True)
    old = await svc.create(name="demo", engine="command", memory_gib=1, mode="on_demand", command=engine_command())

    async def conflict() -> bool:
        return bool(svc.ctx.config_status()["error"]["field"] == "name")

    await wait_until(conflict, timeout=5)  # the file's error now: an API deployment has its name

    demo = Demo(settings, None)
    decl = demo.declaration()
    model, written = await asyncio.to_thread(demo.model, decl)
    assert written and model == Path("data/demo/tiny-random-llama.gguf") and model.read_bytes()[:4] == b"GGUF"
    view = await asyncio.to_thread(demo.deployment, decl)
    out = capsys.readouterr().out
    assert "removing the deployment demo an earlier demo made through the API" in out
    assert "dgxmm created the declared on-demand deployment demo" in out
    assert (view["id"], view["managed_by"], view["declared_in"], view["state"]) == (
        declared_id("demo"),
        "config",
        "examples/deployments.d/demo.toml",
        "stopped",
    )
    assert svc.ctx.deployer.find(old["id"]) is None and svc.ctx.config_status()["error"] is None
    again = await asyncio.to_thread(demo.deployment, decl)  # the same, already stopped
    assert (again["id"], again["state"]) == (view["id"], "stopped")
    assert "the declared deployment demo (id" in capsys.readouterr().out
