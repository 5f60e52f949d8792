"""The model router with real clients and a real engine (issue 27): the OpenAI SDK and the
Anthropic SDK against ``/v1``, where llama.cpp's llama-server answers both APIs. Two on-demand
deployments of the tiny model; each client picks one by name and only that one starts."""

from __future__ import annotations

import os
from pathlib import Path

import anthropic
import httpx
import httpx2
import openai
import pytest
from conftest import KEY, gateway_settings

from dgxmm.demo.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )

HELLO = [{"role": "user", "content": "hello"}]


async def two_tiny_models(serve, tmp_path: Path):  # type: ignore[no-untyped-def]
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    svc = await serve(gateway_settings(tmp_path, engines={"llamacpp_bin": BIN}))
    views = [
        await svc.create(
            name=name,
            engine="llamacpp",
            model=str(model),
            memory_gib=1,
            mode="on_demand",
            aliases=[f"{name}-latest"],
            args=["-c", "1024", "-np", "1"],
        )
        for name in ("tiny-a", "tiny-b")
    ]
    return svc, views


def local() -> httpx.AsyncClient:
    """The OpenAI SDK's HTTP client, calling from an allowed peer."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"), timeout=60)


def local2() -> httpx2.AsyncClient:
    """The same for the Anthropic SDK, which is built on httpx2."""
    return httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(local_address="127.0.0.2"), timeout=60)


async def test_the_openai_sdk_lists_chats_and_streams_with_llama_server(serve, tmp_path: Path) -> None:
    svc, (a, b) = await two_tiny_models(serve, tmp_path)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1", api_key=KEY, http_client=local(), max_retries=0
    )
    async with client:
        names = sorted([model.id async for model in client.models.list()])
        assert (await svc.view(a["id"]))["state"] == "stopped"  # listing starts nothing
        answer = await client.chat.completions.create(model="tiny-a-latest", messages=HELLO, max_tokens=8)  # type: ignore[arg-type]
        stream = await client.chat.completions.create(model="tiny-a", messages=HELLO, max_tokens=8, stream=True)  # type: ignore[arg-type]
        chunks = [chunk async for chunk in stream]
    assert names == ["tiny-a", "tiny-a-latest", "tiny-b", "tiny-b-latest"]
    assert answer.model and answer.choices[0].message.content is not None and answer.usage is not None
    assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)
    assert [(await svc.view(v["id"]))["state"] for v in (a, b)] == ["ready", "stopped"]


async def test_the_anthropic_sdk_sends_messages_through_the_router(serve, tmp_path: Path) -> None:
    """Anthropic's clients send the key as ``x-api-key`` and append ``/v1/messages`` to their
    base URL: the host's root is the base URL."""
    svc, (a, b) = await two_tiny_models(serve, tmp_path)
    client = anthropic.AsyncAnthropic(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}", api_key=KEY, http_client=local2(), max_retries=0
    )
    async with client:
        message = await client.messages.create(model="tiny-b", max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
        # llama-server itself now and then begins a messages stream without its message_start
        # event (measured straight at the engine: 1 or 2 streams in 60), which the SDK cannot
        # finish; such a stream is asked again, up to three times. (dgxmm's byte-for-byte
        # passing of a stream is test_a_stream_through_the_router_is_the_engines_byte_for_byte.)
        for _ in range(3):
            texts = []
            async with client.messages.stream(model="tiny-b-latest", max_tokens=8, messages=HELLO) as stream:  # type: ignore[arg-type]
                async for text in stream.text_stream:
                    texts.append(text)
            try:
                final = await stream.get_final_message()
                break
            except AssertionError:  # the SDK's: no message_start came
                continue
        else:
            raise AssertionError("three streams in a row without message_start")
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "text"
    assert message.usage.output_tokens > 0 and final.usage.output_tokens > 0 and "".join(texts) is not None
    assert [(await svc.view(v["id"]))["state"] for v in (a, b)] == ["stopped", "ready"]
    with pytest.raises(anthropic.AuthenticationError):
        async with anthropic.AsyncAnthropic(
            base_url=f"http://127.0.0.1:{svc.settings.server.port}",
            api_key="wrong",
            http_client=local2(),
            max_retries=0,
        ) as wrong:
            await wrong.messages.create(model="tiny-b", max_tokens=8, messages=HELLO)  # type: ignore[arg-type]


async def test_the_anthropic_sdk_counts_tokens_through_the_router_as_llama_server_does(serve, tmp_path: Path) -> None:
    """``messages.count_tokens`` (Claude Code calls it before each turn) cold-starts a stopped
    model and answers what llama-server answers (issue 42)."""
    svc, (a, b) = await two_tiny_models(serve, tmp_path)
    root = f"http://127.0.0.1:{svc.settings.server.port}"
    async with anthropic.AsyncAnthropic(base_url=root, api_key=KEY, http_client=local2(), max_retries=0) as client:
        counted = await client.messages.count_tokens(model="tiny-a-latest", messages=HELLO)  # type: ignore[arg-type]
    ready = await svc.view(a["id"])
    async with anthropic.AsyncAnthropic(
        base_url=ready["base_url"], api_key="-", max_retries=0, default_headers=svc.engine_auth(a["id"])
    ) as direct:
        straight = await direct.messages.count_tokens(model="tiny-a", messages=HELLO)  # type: ignore[arg-type]
    assert counted.input_tokens > 0 and counted == straight
    assert [ready["state"], (await svc.view(b["id"]))["state"]] == ["ready", "stopped"]
