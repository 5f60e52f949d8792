"""Issue 38's done-when with a real engine: a deployment created with ``hf://ORG/REPO/model.gguf``
is planned while the file downloads from the local hub (tests/hub), then stopped, and its first
request starts llama-server given the local file (a tiny GGUF with random weights).

``make test`` builds llama-server once and passes its path as DGXMM_LLAMA_SERVER.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import caller, gateway_settings, wait_until
from huggingface_hub import constants

from dgxmm.demo.tiny_gguf import write_tiny_gguf
from dgxmm_process import engine_pids
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )


async def test_a_deployment_by_name_downloads_then_its_first_request_starts_llama_server_on_the_local_file(
    serve: Any, hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)  # (progress within the 0.5 MB file)
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    repo = hub.add("org/tiny-GGUF", {"tiny.gguf": gguf, "README.md": b"# a tiny model"})
    repo.stall_after["tiny.gguf"] = len(gguf) // 2  # the hub pauses half-way, until released
    models = {**hub.settings, "reserve_gib": 0, "stall_timeout_s": 60}
    svc = await serve(gateway_settings(tmp_path, engines={"llamacpp_bin": BIN}, models=models))
    made = await svc.create(
        name="tiny",
        engine="llamacpp",
        model="hf://org/tiny-GGUF/tiny.gguf",
        memory_gib=1,
        mode="on_demand",
        args=["-c", "2048", "-np", "1"],
    )
    assert made["state"] == "planned"

    async def downloading() -> dict[str, Any] | None:
        view = await svc.view(made["id"])
        return view if view["state_reason"].startswith("downloading ") else None

    planned = await wait_until(downloading)
    assert planned["state"] == "planned" and planned["status"]["code"] == "planned"
    repo.stall_after.clear()
    hub.released.set()
    stopped = await svc.wait_state(made["id"], "stopped")
    local = tmp_path / "data" / "models" / "models--org--tiny-GGUF" / "snapshots" / repo.commit / "tiny.gguf"
    assert stopped["model_path"] == str(local) and local.read_bytes() == gguf
    assert engine_pids(made["id"]) == []  # on demand: nothing runs before its first request

    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
    async with caller(svc, timeout=120) as gateway:
        answer = await gateway.post(f"/{made['id']}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] is not None
    [pid, *_] = engine_pids(made["id"])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"-m") + 1] == str(local).encode()  # llama-server was given the local file
