"""Simon Willison's ``llm`` CLI against the model router (issue 42), as its users set it up: an
``extra-openai-models.yaml`` entry whose ``api_base`` is dgxmm's ``/v1``, the key stored under
``api_key_name``. One prompt streamed (llm's default) and one with ``--no-stream``, the first a
cold start; and ``llm openai endpoint --models``, which lists the router's names."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import KEY, gateway_settings

from dgxmm.demo.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )
LLM = Path(sys.executable).with_name("llm")  # the test extra's


async def llm(home: Path, *args: str) -> str:
    """Run the ``llm`` command with its configuration in ``home``; its standard output."""
    proc = await asyncio.create_subprocess_exec(
        str(LLM),
        *args,
        env={**os.environ, "LLM_USER_PATH": str(home)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (args, out, err)
    return out.decode()


async def test_llm_prompts_a_stopped_model_through_the_router_streamed_and_not(serve, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    # llm calls from 127.0.0.1, like any local tool: the peer policy allows it here.
    svc = await serve(
        gateway_settings(tmp_path, engines={"llamacpp_bin": BIN}, ondemand={"allowed_cidrs": ["127.0.0.1/32"]})
    )
    view = await svc.create(
        name="tiny",
        engine="llamacpp",
        model=str(model),
        memory_gib=1,
        mode="on_demand",
        aliases=["tiny-latest"],
        args=["-c", "1024", "-np", "1"],
    )
    base = f"http://127.0.0.1:{svc.settings.server.port}/v1"
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: dgxmm-tiny\n  model_name: tiny-latest\n  api_base: {base}\n  api_key_name: dgxmm\n"
    )
    (home / "keys.json").write_text(json.dumps({"dgxmm": KEY}))

    streamed = await llm(home, "prompt", "-n", "-m", "dgxmm-tiny", "-o", "max_tokens", "8", "hello")
    assert (await svc.view(view["id"]))["state"] == "ready"  # the prompt started it
    whole = await llm(home, "prompt", "-n", "--no-stream", "-m", "dgxmm-tiny", "-o", "max_tokens", "8", "hello")
    listed = await llm(home, "openai", "endpoint", base, "--models", "--key", KEY)
    assert streamed.strip() and whole.strip()
    assert listed.split() == ["tiny", "tiny-latest"]
    seen = [
        (r["route"], r["stream"], r["cold_start"], r["status"])
        for r in reversed((await svc.client.get("/api/activity")).json())
    ]  # oldest first
    assert seen == [
        ("chat/completions", True, True, 200),
        ("chat/completions", False, False, 200),
        ("models", False, False, 200),
    ]
