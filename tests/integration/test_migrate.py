"""An imported llama-swap config on the real service (issue 51's "done when"): the deployments
``dgxmm import llama-swap`` writes into ``deployments_dir`` start on their first request and
answer through ``/v1`` by the names llama-swap served them under, its id and its alias (the test
engine as the model's ``cmd``, with llama-swap's ``${PORT}`` and ``${MODEL_ID}`` macros), its
``filters`` applied to what the engine gets."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, TEST_ENGINE, gateway_settings

from dgxmm.cli import main
from dgxmm.declared.plan import declared_id


def router(svc: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )


async def test_imported_models_answer_by_their_llama_swap_names(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DGXMM_CONFIG", raising=False)
    config = tmp_path / "llama-swap.yaml"
    config.write_text(
        f"""
macros:
  "engine": "{sys.executable} {TEST_ENGINE} --port ${{PORT}}"
models:
  "qwen-chat":
    cmd: |
      # the test engine serves the name it is given
      ${{engine}}
      --served-name ${{MODEL_ID}} --reply "imported and answering"
    aliases: ["gpt-4o-mini"]
    ttl: 300
    filters: {{stripParams: "seed", setParams: {{temperature: 0.2}}}}
"""
    )
    folder = tmp_path / "deployments.d"
    with pytest.raises(SystemExit) as exited:
        main(["import", "llama-swap", str(config), "--out", str(folder)])
    assert exited.value.code == 0, capsys.readouterr()
    svc = await serve(gateway_settings(tmp_path, server={"deployments_dir": folder}))
    dep_id = declared_id("qwen-chat")
    view = await svc.view(dep_id)
    assert (view["mode"], view["state"], view["idle_timeout_s"]) == ("on_demand", "stopped", 300)
    async with router(svc) as v1:
        for name in ("qwen-chat", "gpt-4o-mini"):  # started by the first, served by both
            body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "temperature": 1, "seed": 2}
            resp = await v1.post("/chat/completions", json=body)
            assert resp.status_code == 200, resp.text
            answer = resp.json()
            assert answer["model"] == "qwen-chat"
            assert answer["choices"][0]["message"]["content"] == "imported and answering"
        listed = {model["id"] for model in (await v1.get("/models")).json()["data"]}
    assert "qwen-chat" in listed
    ready = await svc.view(dep_id)
    assert ready["state"] == "ready"
    async with httpx.AsyncClient() as c:  # its filters, as the engine got the bodies (item 4)
        seen = [r["body"] for r in (await c.get(ready["base_url"] + "/_test/requests")).json() if r["method"] == "POST"]
    assert [json.loads(body) for body in seen] == [
        {"model": "qwen-chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2}
    ] * 2
