"""LangChain's ``ChatOllama`` (langchain-ollama 1.1.0, over the official ``ollama`` client)
against dgxmm's Ollama API (issue 49 item 8): a call and a stream with a stopped model, through its
cold start, each answered with the engine's words and its counts in LangChain's usage metadata."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import KEY, engine_command, gateway_settings
from langchain_ollama import ChatOllama

pytestmark = pytest.mark.timeout(120)

REPLY = "Hello from the test engine"


async def test_chat_ollama_invokes_and_streams_through_a_cold_start(serve, tmp_path: Path) -> None:
    settings = gateway_settings(tmp_path, ondemand={"allowed_cidrs": ["127.0.0.1/32"]})
    svc = await serve(settings)
    view = await svc.create(name="chat", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    llm = ChatOllama(
        model="chat",
        base_url=f"http://127.0.0.1:{settings.server.port}",
        client_kwargs={"headers": {"Authorization": f"Bearer {KEY}"}},
        temperature=0.2,
    )
    answer = await asyncio.to_thread(llm.invoke, "hi")  # the cold start (its client is synchronous)
    assert answer.content == REPLY
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] > 0
    assert answer.response_metadata["done_reason"] == "stop"
    chunks = await asyncio.to_thread(lambda: list(llm.stream("hi")))
    assert "".join(str(c.content) for c in chunks) == REPLY and len(chunks) > 2  # streamed, in pieces
    events = (await svc.client.get("/api/events/history", params={"deployment_id": view["id"]})).json()
    assert [e["text"] for e in events].count("Started for a request") == 1
    sent = (await svc.client.get("/api/activity", params={"deployment": view["id"]})).json()
    assert len(sent) == 2 and all(row["status"] == 200 for row in sent)
