"""Ollama's API on dgxmm (issue 49), driven by the official ``ollama`` Python client against a
served dgxmm with test engines as real processes, through cold starts: the list with ``:latest``
names, show, ps, chat streamed and not, generate, embed, keep_alive 0's unload, a caller key
limited to one model, the keyless key, and bad input refused in Ollama's shape before any engine
sees it."""

from __future__ import annotations

import json
import os
import signal
import logging
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from conftest import KEY, engine_command, gateway_settings, one_slot_taken

from dgxmm.ollama.translate import MAX_MESSAGES

REPLY = "Hello from the test engine"


def client(svc: Any, key: str | None = KEY, address: str = "127.0.0.2") -> ollama.AsyncClient:
    """The official client, as a user points it at dgxmm: the host's root."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return ollama.AsyncClient(
        host=f"http://127.0.0.1:{svc.settings.server.port}",
        headers=headers,
        transport=httpx.AsyncHTTPTransport(local_address=address),
        timeout=60,
    )


def raw(svc: Any, key: str | None = KEY) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers=headers,
        timeout=60,
    )


async def served(serve: Any, tmp_path: Path, **sections: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """dgxmm with two stopped on-demand models: ``qwen3`` (also called ``qwen``) and ``embedder``."""
    svc = await serve(gateway_settings(tmp_path, **sections))
    chat = await svc.create(
        name="qwen3", engine="command", memory_gib=1, mode="on_demand", aliases=["qwen"], command=engine_command()
    )
    embedder = await svc.create(
        name="embedder", engine="command", memory_gib=1, mode="on_demand", command=engine_command()
    )
    return svc, chat, embedder


async def engine_posts(svc: Any, view: dict[str, Any]) -> list[dict[str, Any]]:
    ready = await svc.view(view["id"])
    async with httpx.AsyncClient() as c:
        recorded = (await c.get(ready["base_url"] + "/_test/requests")).json()
    return [json.loads(r["body"]) for r in recorded if r["method"] == "POST"]


async def test_the_client_lists_shows_chats_with_a_cold_start_and_unloads(serve, tmp_path: Path) -> None:
    svc, chat, _ = await served(serve, tmp_path)
    c = client(svc)
    listed = await c.list()
    assert sorted(m.model for m in listed.models) == ["embedder:latest", "qwen3:latest", "qwen:latest"]
    assert (await c.ps()).models == []
    shown = await c.show("qwen3:latest")
    assert shown.capabilities == ["completion"] and shown.modelinfo is not None
    assert (await svc.view(chat["id"]))["state"] == "stopped", "reading starts nothing"

    parts = [part async for part in await c.chat("qwen3:latest", [{"role": "user", "content": "hi"}], stream=True)]
    assert "".join(p.message.content or "" for p in parts) == REPLY
    final = parts[-1]
    assert final.done and final.done_reason == "stop" and not any(p.done for p in parts[:-1])
    assert (final.load_duration or 0) > 0, "it waited for the cold start"
    [sent] = await engine_posts(svc, chat)
    assert sent["model"] == "qwen3" and sent["messages"] == [{"role": "user", "content": "hi"}]
    assert "keep_alive" not in sent and sent["stream_options"] == {"include_usage": True}
    assert final.prompt_eval_count and final.eval_count == len(REPLY.split()), "the engine's usage"

    whole = await c.chat("qwen", [{"role": "user", "content": "hi"}], stream=False, options={"temperature": 0})
    assert whole.message.content == REPLY and whole.done and whole.load_duration == 0
    gen = await c.generate("qwen3", "say hi", system="terse", stream=False)
    assert gen.response == REPLY and gen.done_reason == "stop"
    running = (await c.ps()).models
    assert [m.model for m in running] == ["qwen3:latest"] and running[0].expires_at is not None

    async with raw(svc) as r:  # Open WebUI's eject: no "stream", so a stream of one line
        ejected = await r.post("/api/generate", json={"model": "qwen3", "prompt": "", "keep_alive": 0})
    assert ejected.headers["content-type"] == "application/x-ndjson"
    [line] = [json.loads(text) for text in ejected.text.splitlines()]
    assert line["done"] is True and line["done_reason"] == "unload" and line["response"] == ""
    assert (await svc.view(chat["id"]))["state"] == "stopped"
    await c.generate("qwen3", "")  # loaded again
    unloaded = await c.generate("qwen3", "", keep_alive=0)
    assert unloaded.done_reason == "unload" and unloaded.response == ""
    assert (await svc.view(chat["id"]))["state"] == "stopped"
    loaded = await c.generate("qwen3", "")
    assert loaded.done_reason == "load" and (await svc.view(chat["id"]))["state"] == "ready"
    assert len(await engine_posts(svc, chat)) == 0, "a load sends the new engine nothing"


async def test_embed_the_older_embeddings_and_the_activity_log_says_ollama(
    serve, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dgxmm.access")
    svc, _, embedder = await served(serve, tmp_path)
    c = client(svc)
    out = await c.embed("embedder", ["a", "b"])
    assert len(out.embeddings) == 2 and out.model == "embedder" and (out.load_duration or 0) > 0
    older = await c.embeddings("embedder:latest", "a")
    assert older.embedding == list(out.embeddings[0])
    records = (await svc.client.get("/api/activity")).json()
    rows = records["records"] if isinstance(records, dict) else records
    assert {row.get("api") for row in rows} == {"ollama"}
    lines = [r.getMessage() for r in caplog.records if r.name == "dgxmm.access"]
    assert any(line.startswith("POST /v1/embeddings 200 (via ollama)") for line in lines), lines


async def test_keep_alive_0_never_stops_a_busy_model_and_tools_reach_the_engine(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view, slot = await one_slot_taken(svc)  # ``m``, ready, its one slot held here
    async with raw(svc) as r:
        busy = await r.post("/api/generate", json={"model": "m", "prompt": "", "keep_alive": 0})
    assert busy.status_code == 409 and "in flight" in busy.json()["error"]
    assert (await svc.view(view["id"]))["state"] == "ready"
    slot.release()
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]
    c = client(svc)
    answer = await c.chat("m", [{"role": "user", "content": "weather?"}], tools=tools, stream=False)
    assert answer.message.content == REPLY
    [sent] = await engine_posts(svc, view)
    assert sent["tools"] == tools
    assert (await c.generate("m", "", keep_alive=0)).done_reason == "unload"
    assert (await svc.view(view["id"]))["state"] == "stopped"


async def test_a_caller_key_sees_and_reaches_only_its_model_and_keyless_acts_as_it(serve, tmp_path: Path) -> None:
    svc, chat, embedder = await served(serve, tmp_path, ollama={"keyless_key": "webui"})
    made = await svc.client.post("/api/keys", json={"name": "webui", "models": ["embedder"]})
    assert made.status_code == 201, made.text
    for c in (client(svc, made.json()["key"]), client(svc, key=None)):
        assert [m.model for m in (await c.list()).models] == ["embedder:latest"]
        with pytest.raises(ollama.ResponseError) as refused:
            await c.chat("qwen3", [{"role": "user", "content": "hi"}], stream=False)
        assert refused.value.status_code == 404 and "qwen3" in refused.value.error
        with pytest.raises(ollama.ResponseError) as hidden:
            await c.show("qwen3")
        assert hidden.value.status_code == 404
        assert len((await c.embed("embedder", "x")).embeddings) == 1
    assert (await svc.view(chat["id"]))["state"] == "stopped"
    with pytest.raises(ollama.ResponseError) as wrong:
        await client(svc, key="sk-wrong").list()
    assert wrong.value.status_code == 401, "a key that is sent is checked, never replaced by the keyless one"
    del embedder


async def test_without_a_keyless_key_no_key_is_401_in_ollamas_shape(serve, tmp_path: Path) -> None:
    svc, _, _ = await served(serve, tmp_path)
    async with raw(svc, key=None) as r:
        resp = await r.get("/api/tags")
    assert resp.status_code == 401 and isinstance(resp.json()["error"], str)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not JSON"),
        (
            {"model": "qwen3", "messages": [{"role": "user", "content": "x"}], "options": {"temperature": "hot"}},
            "temperature",
        ),
        (
            {"model": "qwen3", "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": -3}},
            "num_predict",
        ),
        ({"model": "qwen3", "messages": [{"role": "user", "content": "x"}] * 10_000}, f"at most {MAX_MESSAGES}"),
        ({"model": "qwen3", "messages": [{"role": "user", "content": "x", "images": ["%%%"]}]}, "base64"),
    ],
)
async def test_bad_input_is_a_400_in_ollamas_shape_and_reaches_no_engine(
    serve, tmp_path: Path, body: Any, says: str
) -> None:
    svc, chat, _ = await served(serve, tmp_path)
    async with raw(svc) as r:
        resp = await (r.post("/api/chat", content=body) if isinstance(body, bytes) else r.post("/api/chat", json=body))
    assert resp.status_code == 400 and says in resp.json()["error"], resp.text
    assert list(resp.json()) == ["error"]
    assert (await svc.view(chat["id"]))["state"] == "stopped", "nothing reached (or started) an engine"


async def test_version_what_dgxmm_does_elsewhere_and_latest_on_v1(serve, tmp_path: Path) -> None:
    svc, chat, _ = await served(serve, tmp_path, ollama={"version": "0.9.1"})
    async with raw(svc) as r:
        version = await r.get("/api/version")
        pulled = await r.post("/api/pull", json={"model": "llama3"})
        deleted = await r.request("DELETE", "/api/delete", json={"model": "qwen3"})
        unknown = await r.get("/api/nothing")
        bad_show = await r.post("/api/show", content=b"{nope")
        too_long = await r.post("/api/show", json={"model": "x" * 70_000})
        via_v1 = await r.post(
            "/v1/chat/completions", json={"model": "qwen3:latest", "messages": [{"role": "user", "content": "hi"}]}
        )
    assert version.json() == {"version": "0.9.1"}
    assert pulled.status_code == 501 and "/dgxmm/api/models" in pulled.json()["error"]
    assert deleted.status_code == 403 and "deployments" in deleted.json()["error"]
    assert unknown.status_code == 404 and isinstance(unknown.json()["error"], str)
    assert bad_show.status_code == too_long.status_code == 400 and "model" in bad_show.json()["error"]
    assert via_v1.status_code == 200 and via_v1.json()["choices"][0]["message"]["content"] == REPLY
    async with raw(svc) as r:
        via_api = await r.post(
            "/api/chat", json={"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        )
    assert via_api.json()["message"]["content"] == REPLY
    from_v1, from_api = await engine_posts(svc, chat)
    assert from_v1["model"] == "qwen3", "the engine is asked under its served name"
    assert from_api == from_v1, "the same request through /api/chat costs the engine the same work"


async def test_an_engine_that_dies_mid_stream_ends_the_ndjson_stream_with_an_error_line(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--chunk-delay", "0.3")
    )
    lines: list[dict[str, Any]] = []
    async with raw(svc) as r:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}  # stream absent: streamed
        async with r.stream("POST", "/api/chat", json=body) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"] == "application/x-ndjson"
            async for line in resp.aiter_lines():
                lines.append(json.loads(line))
                if len(lines) == 1:
                    pid = int(svc.ctx.deployer.peek(view["id"]).runtime_handle.ref)  # the process runtime's ref
                    os.kill(pid, signal.SIGKILL)
    assert lines[0]["done"] is False and lines[0]["message"]["content"]
    assert lines[-1] == {"error": "the engine broke off its answer: m"}
    assert not any(line.get("done") for line in lines)


async def test_show_reads_the_models_gguf_header_as_copilot_wants_it(serve, tmp_path: Path) -> None:
    """VS Code Copilot's provider reads ``model_info["general.architecture"]``, that
    architecture's ``context_length`` and ``capabilities`` before it offers a model."""
    from dgxmm.demo.tiny_gguf import write_random_gguf

    svc = await serve(gateway_settings(tmp_path))
    gguf = write_random_gguf(tmp_path / "tiny.gguf", n_ctx=1024)
    view = await svc.create(
        name="tiny", engine="command", model=str(gguf), memory_gib=1, mode="on_demand", command=engine_command()
    )
    async with raw(svc) as r:
        version = await r.get("/api/version")
        tags = await r.get("/api/tags")
        shown = await r.post("/api/show", json={"model": tags.json()["models"][0]["name"]})
    assert tuple(int(n) for n in version.json()["version"].split(".")) >= (0, 6, 4)
    info = shown.json()["model_info"]
    assert info["general.architecture"] == "llama" and info["llama.context_length"] == 1024
    assert info["general.basename"] and shown.json()["capabilities"] == ["completion"]
    assert shown.json()["details"]["format"] == "gguf"
    assert (await svc.view(view["id"]))["state"] == "stopped"
    async with raw(svc) as r:  # then Copilot chats through /v1, under the name /api/tags gave
        chat = await r.post(
            "/v1/chat/completions", json={"model": "tiny:latest", "messages": [{"role": "user", "content": "hi"}]}
        )
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == REPLY


async def test_show_reads_a_model_directory_as_copilot_wants_it(serve, tmp_path: Path) -> None:
    """A vLLM-style model directory has no GGUF header: its config.json says the architecture
    and the context, its chat template the tools, without starting the engine."""
    svc = await serve(gateway_settings(tmp_path))
    model = tmp_path / "Qwen3-0.6B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 40960}))
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if tools %}{% endif %}"}))
    view = await svc.create(
        name="qwen", engine="command", model=str(model), memory_gib=1, mode="on_demand", command=engine_command()
    )
    async with raw(svc) as r:
        shown = await r.post("/api/show", json={"model": "qwen"})
    info = shown.json()["model_info"]
    assert info["general.architecture"] == "qwen3" and info["qwen3.context_length"] == 40960
    assert shown.json()["capabilities"] == ["completion", "tools"]
    assert (await svc.view(view["id"]))["state"] == "stopped"


async def test_a_deployments_capabilities_are_what_show_says_where_files_cannot_tell(serve, tmp_path: Path) -> None:
    """A model the engine fetches itself has no file here: the deployment says what it can do,
    checked when given and changed while it runs; a GGUF's own header gives way to it too."""
    svc = await serve(gateway_settings(tmp_path))
    for bad in (["completion", "flying"], ["tools", "tools"], "tools"):
        resp = await svc.client.post(
            "/api/deployments",
            json={
                "name": "bad",
                "engine": "command",
                "memory_gib": 1,
                "command": engine_command(),
                "capabilities": bad,
            },
        )
        assert resp.status_code == 422 and "capabilities" in resp.text, resp.text
    view = await svc.create(
        name="remote",
        engine="command",
        model="Org/Remote-VL",
        memory_gib=1,
        mode="on_demand",
        command=engine_command(),
        capabilities=["completion", "vision"],
    )
    async with raw(svc) as r:
        shown = await r.post("/api/show", json={"model": "remote:latest"})
    assert shown.json()["capabilities"] == ["completion", "vision"]
    patched = await svc.client.patch(f"/api/deployments/{view['id']}", json={"capabilities": ["embedding"]})
    assert patched.status_code == 200 and patched.json()["capabilities"] == ["embedding"]
    async with raw(svc) as r:
        shown = await r.post("/api/show", json={"model": "remote"})
    assert shown.json()["capabilities"] == ["embedding"]


async def test_keep_alive_is_the_idle_timer_of_the_next_idle_period(serve, tmp_path: Path) -> None:
    """The deployment's idle timeout is 60 s; a chat's ``keep_alive: "1h"`` shows in ``/api/ps``,
    one of -1 never expires (as ``idle_timeout_s = 0``), and one of 1 s is the timeout the reaper
    stopped it by (its event says so), not the deployment's 60 s."""
    svc, chat, _ = await served(serve, tmp_path, ondemand={"reaper_interval_s": 0.2})
    c = client(svc)
    await c.chat("qwen3", [{"role": "user", "content": "hi"}], stream=False, keep_alive="1h")
    [running] = (await c.ps()).models
    assert running.expires_at is not None and running.expires_at.year < 2318
    assert svc.ctx.ondemand.idle_timeout_of(svc.ctx.deployer.peek(chat["id"])) == 3600
    await c.chat("qwen3", [{"role": "user", "content": "hi"}], stream=False, keep_alive=-1)
    [running] = (await c.ps()).models  # never for idleness, as idle_timeout_s = 0
    assert running.expires_at is not None and running.expires_at.year == 2318
    assert svc.ctx.ondemand.idle_timeout_of(svc.ctx.deployer.peek(chat["id"])) == 0
    await c.chat("qwen3", [{"role": "user", "content": "hi"}], stream=False, keep_alive=1)
    await svc.wait_state(chat["id"], "stopped", timeout=60)
    texts = [e["text"] for e in svc.ctx.store.list_events(20, chat["id"])]
    assert "Stopped after 1 s idle" in texts, texts  # the reaper's own word: the keep_alive, not the 60 s


async def test_num_ctx_past_the_engines_context_is_refused_never_cut(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="long", engine="command", memory_gib=1, mode="on_demand", args=["-c", "2048"], command=engine_command()
    )
    other = await svc.client.post("/api/keys", json={"name": "other", "models": ["elsewhere"]})
    body = {"model": "long:latest", "messages": [{"role": "user", "content": "x"}], "options": {"num_ctx": 4096}}
    async with raw(svc) as r:
        refused = await r.post("/api/chat", json=body)
    async with raw(svc, other.json()["key"]) as r:
        hidden = await r.post("/api/chat", json=body)
    assert refused.status_code == 400 and "2048" in refused.json()["error"], refused.text
    assert hidden.status_code == 404 and "2048" not in hidden.text, "no other key's model's context is told"
    assert (await svc.view(view["id"]))["state"] == "stopped"
