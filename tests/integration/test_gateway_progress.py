"""A wait's progress as reasoning (issue 59): a caller whose key asked for it gets its SSE answer
at once and dgxmm's lines in ``delta.reasoning_content`` while its model starts or waits for
memory, then the engine's answer unchanged; tools in the body or not. Through real sockets, the
test engine as a real process whose load the test holds (``--start-gate``), so that the order of
what the caller saw and what the engine did is a fact, not a measured time."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import KEY, engine_command, gateway_settings, wait_until

from dgxmm.gateway import progress

pytestmark = pytest.mark.timeout(60)

TOOLS = [
    {
        "type": "function",
        "function": {"name": "search", "description": "look up", "parameters": {"type": "object", "properties": {}}},
    }
]
ASK = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}


@pytest.fixture(autouse=True)
def often(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line every 0.3 s while a wait lasts, so that one shows within the test's wait."""
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.3)
    monkeypatch.setattr(progress, "LOOK_EVERY_S", 0.1)


def sdk(svc: Any, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=key,
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        http_client=httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")),
        max_retries=0,
    )


async def progress_key(svc: Any) -> str:
    made = await svc.client.post("/api/keys", json={"name": "webui", "progress": "reasoning"})
    assert made.status_code == 201, made.text
    return str(made.json()["key"])


def reasoning(chunk: Any) -> str | None:
    return (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") if chunk.choices else None


async def test_a_cold_start_with_tools_is_told_as_reasoning_then_the_engine_answers(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    gate = tmp_path / "load"
    dep = await svc.create(
        name="chat-small",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=engine_command("--start-gate", str(gate), "--call-tools"),
    )
    client = sdk(svc, await progress_key(svc))
    # The SDK's streaming helper: its raw chunks, then the completion it puts together.
    async with client.chat.completions.stream(model="chat-small", **ASK) as helper:
        chunks = (event.chunk async for event in helper if event.type == "chunk")
        first = await anext(chunks)
        # Told before the engine could answer: its load is held until the gate opens.
        assert not gate.exists() and (await svc.view(dep["id"]))["state"] in ("stopped", "starting")
        assert first.object == "chat.completion.chunk" and first.model == "chat-small"
        assert first.id.startswith("chatcmpl-") and first.choices[0].delta.role is None  # the engine's has it
        assert first.choices[0].delta.content is None and "chat-small" in (reasoning(first) or "")
        second = await anext(chunks)  # more while the start lasts
        assert reasoning(second) and second.id == first.id
        gate.touch()
        rest = [chunk async for chunk in chunks]
        final = await helper.get_final_completion()
    engine = rest[rest.index(ready(rest)) + 1 :]
    assert not any(reasoning(c) for c in engine) and all(c.id != first.id for c in engine), "the engine's own"
    assert "".join(c.choices[0].delta.content or "" for c in engine if c.choices) == "Hello from the test engine"
    calls = [t for c in engine if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "search" and "".join(t.function.arguments for t in calls) == '{"q": "hi"}'
    assert engine[-1].choices[0].finish_reason == "tool_calls"
    message = final.choices[0].message
    assert message.content == "Hello from the test engine" and message.tool_calls[0].function.arguments == '{"q": "hi"}'
    assert message.role == "assistant", message.role  # once: what a tool loop sends back
    assert message.model_extra["reasoning_content"].startswith("Starting chat-small on demand")
    await client.close()


def ready(chunks: list[Any]) -> Any:
    return next(c for c in chunks if (reasoning(c) or "").startswith("Ready after "))


async def test_a_memory_wait_names_what_it_waits_for(serve, tmp_path: Path) -> None:
    """The key file's ``[ondemand] progress``: "b" waits for "a", which holds the host's memory."""
    settings = gateway_settings(
        tmp_path, memory={"capacity_gib": 2}, ondemand={"idle_timeout_s": 0.5, "progress": "reasoning"}
    )
    svc = await serve(settings)
    a = await svc.create(name="a", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await svc.create(name="b", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await svc.client.post(f"/api/deployments/{a['id']}/start")
    await svc.wait_state(a["id"], "ready")
    slot = await svc.ctx.ondemand.acquire(a["id"])
    client = sdk(svc, KEY)
    stream = await client.chat.completions.create(model="b", stream=True, **ASK)
    chunks = aiter(stream)
    seen = [await anext(chunks)]
    while "Waiting for memory: a " not in (reasoning(seen[-1]) or ""):
        seen.append(await anext(chunks))
    assert svc.ctx.ondemand.status(a["id"])["inflight"] == 1, "told while a still held its slot"
    slot.release()  # "a" goes idle, is stopped to make room, "b" starts
    rest = [chunk async for chunk in chunks]
    assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == "Hello from the test engine"
    assert any((reasoning(c) or "").startswith("Ready after ") for c in rest)
    await client.close()


async def events_of(svc: Any, key: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """A streamed chat's status and its events' data, as a plain HTTP client reads them."""
    async with (
        httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"), timeout=30) as g,
        g.stream(
            "POST",
            f"http://127.0.0.1:{svc.settings.server.port}/v1/chat/completions",
            json={**body, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        ) as resp,
    ):
        lines = [x async for x in resp.aiter_lines()]
    return resp.status_code, [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


async def test_a_failed_start_ends_the_stream_with_todays_error_after_the_lines(serve, tmp_path: Path) -> None:
    """Two requests wait for one start that fails (held, then failed): the key file's, without
    progress and not streamed, gets today's 503; the progress key's stream the same error body
    after its lines."""
    svc = await serve(gateway_settings(tmp_path))
    gate = tmp_path / "load"
    flags = ("--start-gate", str(gate), "--fail-start")
    await svc.create(name="bad", engine="command", memory_gib=1, mode="on_demand", command=engine_command(*flags))
    key = await progress_key(svc)
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.3"), timeout=30) as g:
        url = f"http://127.0.0.1:{svc.settings.server.port}/v1/chat/completions"
        plain = asyncio.create_task(
            g.post(url, json={"model": "bad", **ASK}, headers={"Authorization": f"Bearer {KEY}"})
        )
        streamed = asyncio.create_task(events_of(svc, key, {"model": "bad", **ASK}))
        await wait_until(lambda: svc.ctx.ondemand.total_waiting == 2)
        gate.touch()
        today, (status, events) = await plain, await streamed
    assert today.status_code == 503 and today.json()["error"]["code"] == "start_failed"
    assert status == 200
    *lines, error = events
    assert lines and all(list(e["choices"][0]["delta"]) == ["reasoning_content"] for e in lines)
    assert error == today.json()
    assert not any(e["choices"][0]["delta"]["reasoning_content"].startswith("Ready") for e in lines)


async def test_a_cancel_while_told_is_an_error_after_the_lines(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    gate = tmp_path / "load"
    await svc.create(
        name="held", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--start-gate", str(gate))
    )
    streamed = asyncio.create_task(events_of(svc, await progress_key(svc), {"model": "held", **ASK}))
    rows = await wait_until(lambda: svc.ctx.ondemand.waiting())
    assert (await svc.client.post(f"/api/waiting/{rows[0]['id']}/cancel")).status_code == 200
    status, events = await streamed
    assert status == 200 and events[0]["choices"][0]["delta"]["reasoning_content"].startswith("Starting held")
    assert events[-1]["error"]["code"] == "ondemand_cancelled"
    gate.touch()


async def test_a_hang_up_while_told_gives_everything_back(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    gate = tmp_path / "load"
    await svc.create(
        name="held", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--start-gate", str(gate))
    )
    client = sdk(svc, await progress_key(svc))
    stream = await client.chat.completions.create(model="held", stream=True, **ASK)
    assert reasoning(await anext(aiter(stream)))
    await stream.close()
    await wait_until(lambda: svc.ctx.ondemand.total_waiting == 0)
    gate.touch()
    await client.close()


async def test_a_ready_model_answers_as_the_engine_does(serve, tmp_path: Path) -> None:
    """Nothing to wait for: no line, the engine's stream alone."""
    svc = await serve(gateway_settings(tmp_path))
    dep = await svc.create(name="warm", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    await svc.client.post(f"/api/deployments/{dep['id']}/start")
    await svc.wait_state(dep["id"], "ready")
    client = sdk(svc, await progress_key(svc))
    stream = await client.chat.completions.create(model="warm", stream=True, **ASK)
    chunks = [c async for c in stream]
    assert not any(reasoning(c) for c in chunks) and chunks[0].choices[0].delta.content == ""
    await wait_until(lambda: svc.ctx.ondemand.status(dep["id"])["inflight"] == 0)
    await client.close()


async def test_llm_prints_the_engine_answer_alone(serve, tmp_path: Path) -> None:
    """Simon Willison's ``llm`` (its OpenAI plugin, streamed: its default) through a cold start:
    it prints ``content`` only, the engine's."""
    svc = await serve(gateway_settings(tmp_path, ondemand={"allowed_cidrs": ["127.0.0.1/32"]}))
    await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    home = tmp_path / "llm"
    home.mkdir()
    base = f"http://127.0.0.1:{svc.settings.server.port}/v1"
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: m\n  model_name: m\n  api_base: {base}\n  api_key_name: dgxmm\n"
    )
    (home / "keys.json").write_text(json.dumps({"dgxmm": await progress_key(svc)}))
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("llm")),
        *("prompt", "-n", "-m", "m", "hello"),
        env={**os.environ, "LLM_USER_PATH": str(home)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    assert out.decode() == "Hello from the test engine\n"
    [row] = (await svc.client.get("/api/activity")).json()
    assert row["cold_start"] and row["stream"] and row["key"] == "webui"
