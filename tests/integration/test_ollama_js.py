"""Ollama's official JavaScript client (npm ``ollama``, installed by scripts/install-ollama-js.sh,
which .ci/run runs) against dgxmm's Ollama API (issue 49 item 8): it lists the host's models by
their ``:latest`` names and chats, streamed, with a stopped model, through its cold start; its
final object carries the engine's counts. The client runs in Node, as its users run it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import KEY, engine_command, gateway_settings

pytestmark = pytest.mark.timeout(120)

CLIENT = os.environ.get("DGXMM_OLLAMA_JS")
if not CLIENT or shutil.which("node") is None:
    pytest.skip(
        "DGXMM_OLLAMA_JS is not set (scripts/install-ollama-js.sh; .ci/run sets it) or node is missing",
        allow_module_level=True,
    )

SCRIPT = """
import { Ollama } from "ollama";
const ollama = new Ollama({ host: process.env.HOST, headers: { Authorization: `Bearer ${process.env.KEY}` } });
const listed = (await ollama.list()).models.map((m) => m.name);
let content = "";
let last = null;
for await (const part of await ollama.chat({
  model: "chat", messages: [{ role: "user", content: "hi" }], stream: true,
})) {
  content += part.message.content;
  if (part.done) last = part;
}
console.log(JSON.stringify({ listed, content, done_reason: last.done_reason, eval_count: last.eval_count }));
"""


async def test_the_javascript_client_lists_and_chats_streamed_through_a_cold_start(serve, tmp_path: Path) -> None:
    assert CLIENT is not None
    settings = gateway_settings(tmp_path, ondemand={"allowed_cidrs": ["127.0.0.1/32"]})
    svc = await serve(settings)
    view = await svc.create(name="chat", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    node = await asyncio.create_subprocess_exec(
        "node",
        "--input-type=module",
        "-e",
        SCRIPT,
        cwd=CLIENT,  # (its node_modules: an ES module resolves from there)
        env={**os.environ, "HOST": f"http://127.0.0.1:{settings.server.port}", "KEY": KEY},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), 90)
    assert node.returncode == 0, err.decode()
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["listed"] == ["chat:latest"]
    assert seen["content"] == "Hello from the test engine" and seen["done_reason"] == "stop"
    assert seen["eval_count"] > 0  # the engine's usage, as Ollama counts it
    events = (await svc.client.get("/api/events/history", params={"deployment_id": view["id"]})).json()
    assert "Started for a request" in [e["text"] for e in events]  # the chat was its cold start
